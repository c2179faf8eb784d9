"""The kafka-broker fault's keeper and request (infra/kafka_outage.py) with a stand-in for the
broker's process, on the test Redis (no database, no broker); the ProcessGroup's hold that keeps
a child down for a while, with real child processes; and a launcher's real broker (a group
child) held down for an outage and started again on its data. A job through such an outage is
tests/integration/test_kafka_broker_fault_live.py."""

from __future__ import annotations

import json
import signal
import sys
import time
import uuid

import pytest
from django.conf import settings

from infra import keys
from infra.kafka import KafkaBroker, port_open
from infra.kafka_outage import (
    ASKED,
    DOWN,
    REFUSED,
    UP,
    BrokerKeeper,
    OutageRefused,
    outage,
    registration,
    request_outage,
)
from infra.launcher import start_kafka_if_needed, wait_for
from infra.process_group import ProcessGroup
from infra.redis_client import redis_client
from tests.infra.test_kafka_broker import new_topic, produce
from tests.kafka_topics import committed


class FakeBroker:
    """What a keeper needs of a broker's process: its pid, down, up, an outage's end."""

    supervisor = "owner"

    def __init__(self):
        self.pid: int | None = 4242
        self.calls: list[tuple] = []

    def down(self, hard: bool, seconds: float) -> None:
        self.calls.append(("down", hard, seconds))
        self.pid = None

    def up(self, timeout_s: float) -> None:
        self.calls.append(("up",))
        self.pid = 4243

    def end_outage(self) -> None:
        self.calls.append(("end",))
        self.pid = 4244


@pytest.fixture
def client():
    conn = redis_client(settings.REDIS_URL)
    yield conn
    conn.close()


@pytest.fixture
def keeper(client, tmp_path):
    """A keeper of a stand-in broker at an address of this test's own (not started: the test
    calls tick() itself)."""
    bootstrap = f"broker-{uuid.uuid4().hex[:8]}:9092"
    kept = BrokerKeeper(FakeBroker(), settings.REDIS_URL, tmp_path, bootstrap)
    kept.register()
    yield kept
    client.delete(keys.kafka_broker(bootstrap), keys.kafka_broker_outage(bootstrap))
    client.delete(*(keys.fault_carried_out(f) for f in (9001, 9002, 9003)))


def test_a_registered_broker_is_stopped_for_the_duration_then_started_once(client, keeper):
    entry = registration(client, keeper.bootstrap)
    assert (entry.pid, entry.token, entry.supervisor) == (4242, keeper.token, "owner")
    assert client.ttl(keys.kafka_broker(keeper.bootstrap)) > 0
    asked = request_outage(client, keeper.bootstrap, 9001, "job-a", 0.5, hard=True)
    assert (asked.state, asked.token, asked.duration_s) == (ASKED, keeper.token, 0.5)
    # Asking again for the same fault (a redelivered task) changes nothing.
    assert request_outage(client, keeper.bootstrap, 9001, "job-a", 0.5) == asked
    keeper.tick()
    down = outage(client, keeper.bootstrap)
    assert down.state == DOWN and down.until == pytest.approx(down.down_at + 0.5)
    assert keeper.control.calls == [("down", True, 0.5)]
    assert registration(client, keeper.bootstrap).pid is None
    assert registration(client, keeper.bootstrap).down_until == down.until
    # Another fault's outage is refused while this one holds the broker down.
    with pytest.raises(OutageRefused, match="already down for fault #9001"):
        request_outage(client, keeper.bootstrap, 9002, "job-a", 5)
    keeper.tick()  # not over yet
    assert keeper.control.calls == [("down", True, 0.5)]
    time.sleep(0.6)
    keeper.tick()
    back = outage(client, keeper.bootstrap)
    assert back.state == UP and back.back_at >= down.until
    assert keeper.control.calls == [("down", True, 0.5), ("up",)]
    assert registration(client, keeper.bootstrap).pid == 4243
    # The record written again as asked (a stale writer) does not stop the broker twice.
    client.set(keys.kafka_broker_outage(keeper.bootstrap), asked.to_json())
    keeper.tick()
    assert keeper.control.calls == [("down", True, 0.5), ("up",)]
    assert outage(client, keeper.bootstrap).detail == "fault #9001 was carried out already"
    # Once it is up, another fault may take it down again.
    assert request_outage(client, keeper.bootstrap, 9002, "job-a", 5, hard=False).state == ASKED


def test_no_registration_no_outage(client):
    with pytest.raises(OutageRefused, match="no broker of Backstop's own is registered"):
        request_outage(client, f"nobody-{uuid.uuid4().hex[:8]}:9092", 9001, "job-a", 5)


def test_a_request_for_an_earlier_keeper_or_too_long_is_refused_and_reported(client, keeper):
    cursor = (client.xrevrange(keys.agent_events(), count=1) or [("0-0", {})])[0][0]
    request_outage(client, keeper.bootstrap, 9001, "job-a", 5)
    record = json.loads(client.get(keys.kafka_broker_outage(keeper.bootstrap)))
    record["token"] = "an-earlier-keeper"
    client.set(keys.kafka_broker_outage(keeper.bootstrap), json.dumps(record))
    keeper.tick()
    refused = outage(client, keeper.bootstrap)
    assert refused.state == REFUSED and "earlier keeper" in refused.detail
    assert keeper.control.calls == []
    events = client.xrange(keys.agent_events(), min=f"({cursor}")
    mine = [fields for _id, fields in events if fields.get("fault_id") == "9001"]
    assert mine and mine[-1]["kind"] == keys.EVENT_REFUSED and mine[-1]["job"] == "job-a"
    # The keeper's own bound: FAULT_MAX_DURATION_S (600 s unless set).
    request_outage(client, keeper.bootstrap, 9003, "job-a", 601)
    keeper.tick()
    assert outage(client, keeper.bootstrap).state == REFUSED
    assert "at most 600 s" in outage(client, keeper.bootstrap).detail
    assert keeper.control.calls == []


def test_stopping_the_keeper_ends_an_outage_and_withdraws_the_registration(client, keeper):
    request_outage(client, keeper.bootstrap, 9001, "job-a", 60)
    keeper.tick()
    assert keeper.control.calls == [("down", True, 60.0)]
    keeper.stop()
    assert keeper.control.calls[-1] == ("end",)
    assert registration(client, keeper.bootstrap) is None


def starts_of(path) -> list[float]:
    return [float(line) for line in path.read_text().split()] if path.exists() else []


def test_a_held_child_is_started_again_when_the_hold_ends_not_before(tmp_path):
    marker = tmp_path / "starts"
    script = f"import time; open({str(marker)!r}, 'a').write(f'{{time.time()}}\\n'); time.sleep(60)"
    group = ProcessGroup(tmp_path / "log", say=None)
    group.start("held", [sys.executable, "-c", script])
    try:
        wait_for(lambda: len(starts_of(marker)) == 1, 30, "the first start")
        held_at = time.time()
        proc = group.hold("held", 3.0, signal.SIGKILL)
        proc.wait(timeout=10)
        time.sleep(1.5)  # the watcher looks every second: it would have restarted it by now
        assert group.restart_exited() == []
        assert len(starts_of(marker)) == 1
        wait_for(lambda: len(starts_of(marker)) == 2, 30, "the start after the hold")
        assert starts_of(marker)[1] - held_at >= 2.9
        child = group.children["held"]
        assert (child.restarts, child.quick_exits, child.held_until) == (1, 0, None)
        # release() ends a hold at once.
        group.hold("held", 60.0, signal.SIGTERM).wait(timeout=10)
        released_at = time.time()
        group.release("held")
        wait_for(lambda: len(starts_of(marker)) == 3, 30, "the start at the release")
        assert starts_of(marker)[2] - released_at < 10
    finally:
        group.stop(grace_s=5)
    log = (tmp_path / "log" / "launcher.log").read_text()
    assert "holding held down for 3 s" in log


def test_a_launchers_broker_is_held_down_for_the_outage_then_started_on_its_data(
    tmp_path, monkeypatch, client
):
    """The launcher's broker (a ProcessGroup child, kept when given a Redis URL): the outage
    stops it cleanly (SIGTERM), the group does not start it again before the outage is over,
    and the keeper starts it on the same port and data; the group's stop ends the keeper."""
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    group = ProcessGroup(tmp_path / "log", say=None)
    try:
        bootstrap = start_kafka_if_needed(group, tmp_path / "kafka", redis_url=settings.REDIS_URL)
        child = group.children["kafka"]
        first_pid = child.proc.pid
        entry = registration(client, bootstrap)
        assert (entry.pid, entry.supervisor) == (first_pid, "process-group")
        topic = new_topic(bootstrap)
        produce(bootstrap, topic, [(b"k", b"before")])
        request_outage(client, bootstrap, 9001, "job-a", 3, hard=False)
        wait_for(lambda: getattr(outage(client, bootstrap), "state", None) == DOWN, 10, "down")
        wait_for(lambda: child.proc.poll() is not None, 30, "the broker to exit")
        assert child.restarts == 0 and not port_open(int(bootstrap.rsplit(":", 1)[1]))
        wait_for(lambda: outage(client, bootstrap).state == UP, 120, "the broker back")
        back = outage(client, bootstrap)
        assert back.back_at - back.down_at >= 3
        assert child.restarts == 1 and child.proc.pid != first_pid
        assert registration(client, bootstrap).pid == child.proc.pid
        assert KafkaBroker(tmp_path / "kafka").bootstrap_servers == bootstrap  # same port
        assert [v for *_at, v in committed(bootstrap, topic)] == [b"before"]  # same data
        assert "holding kafka down for 8 s" in (tmp_path / "log" / "launcher.log").read_text()
    finally:
        group.stop()
        client.delete(keys.kafka_broker_outage(bootstrap), keys.fault_carried_out(9001))
    assert registration(client, bootstrap) is None
