"""Spare refills held while a stage is re-protected, on a real Redis: the controller's cycle
renews the hold without lowering any node's target, a spare taking over a replica takes the
hold at once, and a node agent under the hold starts no spare and stops none."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from console.policy.config import PolicyConfig
from console.services.control import act
from console.services.control.act import keep_warm_spares
from infra import keys as control_keys
from infra.launcher import wait_for
from infra.node_metrics import machine_identity
from infra.processes import SPARE_MODULE, STAGE_MODULE
from spark_runtime import keys as data_keys
from spark_runtime import spare
from spark_runtime.cpu_priority import can_raise_priority
from spark_runtime.spare import SPARE_START_TIMEOUT_S, release_warmup_lock, take_warmup_lock
from spark_runtime.strategies import NEEDED_SPARE_HELD_NICE, SPARE_NICE
from tests.agent_edge import publish_usage
from tests.factories import NodeFactory
from workers import agent
from workers.node import children, spares

pytestmark = pytest.mark.django_db

NODES = ["wt-node-1", "wt-node-2"]
# The machine as the agents here know it (the boot id, else the host name).
MACHINE = machine_identity()


@pytest.fixture(autouse=True)
def spare_keys_cleared(redis_conn):
    redis_conn.delete(data_keys.spare_refill_hold(), data_keys.spare_needed())
    yield
    redis_conn.delete(
        data_keys.spare_refill_hold(),
        data_keys.spare_needed(),
        *(k for n in NODES for k in (control_keys.node_heartbeat(n), control_keys.node_metrics(n),
                                     data_keys.spares_wanted(n), data_keys.spares(n),
                                     data_keys.spare_asked(n))),
    )  # fmt: skip


@pytest.fixture
def spare_process():
    """A process that reads as warm spare `spare-x` of its node (the agent knows a spare by
    its command line): it stands in for the spare's JVM, which these checks do not need."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)",
         "-m", SPARE_MODULE, "--spare-id", "spare-x"]
    )  # fmt: skip
    yield proc
    proc.kill()
    proc.wait()


def targets(client) -> dict[str, int]:
    return {n: int(client.get(data_keys.spares_wanted(n)) or 0) for n in NODES}


def test_a_re_protecting_job_holds_refills_without_lowering_targets(redis_conn):
    for name in NODES:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    publish_usage(redis_conn, NODES)  # two idle nodes with no spares yet
    config = PolicyConfig(warm_spares_per_node=1)
    keep_warm_spares(redis_conn, config, {}, reprotecting=True)
    assert 0 < redis_conn.ttl(data_keys.spare_refill_hold()) <= spare.REFILL_HOLD_S
    # The targets stay the policy's: a spare starting or warm now is not stopped for the hold.
    assert targets(redis_conn) == {"wt-node-1": 1, "wt-node-2": 1}
    # Another job's cycle neither renews nor lifts it; it expires on its own.
    redis_conn.expire(data_keys.spare_refill_hold(), 1)
    keep_warm_spares(redis_conn, config, {})
    assert redis_conn.ttl(data_keys.spare_refill_hold()) <= 1


def test_nodes_whose_agents_share_a_host_share_its_spares(redis_conn):
    for name in NODES:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    config = PolicyConfig(warm_spares_per_node=1)
    # The agents' heartbeats name their host (workers/node/loops.py:
    # infra.node_metrics.host_identity).
    publish_usage(redis_conn, NODES, hosts={n: "one-machine" for n in NODES})
    assert sum(keep_warm_spares(redis_conn, config, {}).values()) == 1
    assert sum(targets(redis_conn).values()) == 1
    publish_usage(redis_conn, NODES)  # a host each
    keep_warm_spares(redis_conn, config, {})
    assert targets(redis_conn) == {"wt-node-1": 1, "wt-node-2": 1}


def test_a_hosts_spare_warming_up_keeps_its_node_when_another_looks_better(redis_conn):
    for name in NODES:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    config = PolicyConfig(warm_spares_per_node=1)
    entry = {"pid": os.getpid(), "state": "starting", "since": time.time()}
    redis_conn.hset(data_keys.spares("wt-node-2"), "spare-w", json.dumps(entry))
    # Its JVM start loads wt-node-2: wt-node-1 has the better Q now.
    publish_usage(
        redis_conn, NODES, cpu_used={"wt-node-2": 1.5}, hosts={n: "one-machine" for n in NODES}
    )
    keep_warm_spares(redis_conn, config, {})
    assert targets(redis_conn) == {"wt-node-1": 0, "wt-node-2": 1}


def test_two_jobs_cycles_a_moment_apart_ask_for_the_hosts_spare_on_one_node(redis_conn):
    """Each job's cycle puts the host's one spare where it covers that job's stages. Two cycles
    before the agent has started the first one's spare asked for it on two nodes, and one JVM
    start was wasted: the spare asked for now counts as held for a few seconds."""
    for name in NODES + ["wt-node-3"]:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    nodes = NODES + ["wt-node-3"]
    config = PolicyConfig(warm_spares_per_node=1)
    # Three agents' processes on one 4 GB machine, 300 MiB each: room for a spare within the
    # host's reserve (at 1 GB each it would not fit: console.policy.reserve).
    publish_usage(redis_conn, nodes, hosts={n: "one-machine" for n in nodes}, mem_used=300.0)
    try:
        # Job A's stage runs on nodes 1 and 2: its spare belongs on node 3.
        keep_warm_spares(redis_conn, config, {"count": ("wt-node-1", "wt-node-2")})
        assert {n: int(redis_conn.get(data_keys.spares_wanted(n))) for n in nodes} == {
            "wt-node-1": 0, "wt-node-2": 0, "wt-node-3": 1,
        }  # fmt: skip
        # Job B's (nodes 3 and 1) would rather have it on node 2; node 3's agent has not
        # started it yet.
        keep_warm_spares(redis_conn, config, {"split": ("wt-node-3", "wt-node-1")})
        assert int(redis_conn.get(data_keys.spares_wanted("wt-node-3"))) == 1
        assert int(redis_conn.get(data_keys.spares_wanted("wt-node-2"))) == 0
        # Once the ask has expired with nothing started, job B's cycle may move it.
        redis_conn.delete(data_keys.spare_asked("wt-node-3"))
        keep_warm_spares(redis_conn, config, {"split": ("wt-node-3", "wt-node-1")})
        assert int(redis_conn.get(data_keys.spares_wanted("wt-node-2"))) == 1
        assert int(redis_conn.get(data_keys.spares_wanted("wt-node-3"))) == 0
        assert 0 < redis_conn.ttl(data_keys.spare_asked("wt-node-2")) <= act.SPARE_ASK_S
    finally:
        redis_conn.delete(
            *(k for n in nodes for k in (data_keys.spare_asked(n), data_keys.spares_wanted(n),
                                         control_keys.node_heartbeat(n)))
        )  # fmt: skip


def test_the_cycle_asks_for_a_spare_until_one_is_idle_off_the_stage_s_nodes(redis_conn):
    """Warming spares take the normal priority only while a job lacks an idle spare where its
    next fault would start a process (the agents report their idle spares with their
    heartbeats): not on the stage's nodes, not on a dead node."""
    for name in NODES + ["wt-node-3"]:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    config = PolicyConfig(warm_spares_per_node=1)
    placements = {"count": ("wt-node-1", "wt-node-2")}
    # wt-node-3 has no heartbeat (down): its idle spare is not reported.
    publish_usage(redis_conn, NODES, idle_spares={"wt-node-2": 1})
    keep_warm_spares(redis_conn, config, placements)
    assert 0 < redis_conn.ttl(data_keys.spare_needed()) <= 2 * config.cycle_interval_s + 1
    # An idle spare on the primary's node covers it once it has no standby (a restart).
    redis_conn.delete(data_keys.spare_needed())
    publish_usage(redis_conn, NODES, idle_spares={"wt-node-1": 1, "wt-node-2": 1})
    keep_warm_spares(redis_conn, config, {"count": ("wt-node-1", None)})
    assert not redis_conn.exists(data_keys.spare_needed())


def test_a_node_under_the_hold_starts_no_spare_and_stops_none(redis_conn, spare_process):
    node = NODES[0]
    entry = {"pid": spare_process.pid, "state": "starting", "since": time.time()}
    redis_conn.hset(data_keys.spares(node), "spare-x", json.dumps(entry))
    redis_conn.set(data_keys.spares_wanted(node), 2)
    spare.hold_spare_refills(redis_conn)
    spares.reconcile_spares(redis_conn, node)
    assert list(redis_conn.hgetall(data_keys.spares(node))) == ["spare-x"], "none started"
    assert not redis_conn.exists(data_keys.spare_control(node, "spare-x")), "none told to stop"
    assert spare_process.poll() is None


def test_a_spare_taking_over_a_replica_holds_refills_at_once(
    redis_conn, spare_process, monkeypatch
):
    node = NODES[0]
    monkeypatch.setenv("BACKSTOP_NODE", node)
    entry = {"pid": spare_process.pid, "state": "idle", "since": 0}
    redis_conn.hset(data_keys.spares(node), "spare-x", json.dumps(entry))
    assert (
        spares.hand_to_spare(["--replica-id", "count-3"], "count-3", "job-x") == spare_process.pid
    )
    assert 0 < redis_conn.ttl(data_keys.spare_refill_hold()) <= spare.REFILL_HOLD_S
    command = json.loads(redis_conn.lpop(data_keys.spare_control(node, "spare-x")))
    assert command == {"cmd": "become", "args": ["--replica-id", "count-3"]}
    redis_conn.delete(data_keys.spare_control(node, "spare-x"))


def test_with_no_idle_spare_a_replica_takes_the_spare_still_warming_up(redis_conn, spare_process):
    """The agent's side: an idle spare first, else the warming one furthest along, never one
    whose start hung."""
    now = time.time()
    entries = {
        "spare-new": {"state": "starting", "since": now - 2},
        "spare-old": {"state": "starting", "since": now - 20},
        "spare-hung": {"state": "starting", "since": now - SPARE_START_TIMEOUT_S - 1},
    }
    assert spares.spares_to_take(entries, now) == ["spare-old", "spare-new"]
    entries["spare-z"] = {"state": "idle", "since": now}
    assert spares.spares_to_take(entries, now)[0] == "spare-z"


def test_a_spare_taken_while_warming_up_does_not_turn_idle(redis_conn, spare_process, monkeypatch):
    """Both sides on Redis: the agent takes the warming spare (its entry deleted, the command
    queued), and the spare, once warm, finds itself taken instead of registering as idle."""
    node = NODES[0]
    monkeypatch.setenv("BACKSTOP_NODE", node)
    entry = {"pid": spare_process.pid, "state": "starting", "since": time.time()}
    redis_conn.hset(data_keys.spares(node), "spare-x", json.dumps(entry))
    assert (
        spares.hand_to_spare(["--replica-id", "count-3"], "count-3", "job-x") == spare_process.pid
    )
    assert not spare.mark_idle(redis_conn, node, "spare-x")
    assert not redis_conn.hexists(data_keys.spares(node), "spare-x"), "not offered to another taker"
    command = json.loads(redis_conn.lpop(data_keys.spare_control(node, "spare-x")))
    assert command["cmd"] == "become"
    # A spare nobody took turns idle.
    redis_conn.hset(data_keys.spares(node), "spare-y", json.dumps(entry))
    assert spare.mark_idle(redis_conn, node, "spare-y")
    assert json.loads(redis_conn.hget(data_keys.spares(node), "spare-y"))["state"] == "idle"


def test_a_spare_taken_while_its_jvm_starts_is_found_and_killed_as_that_replica(
    redis_conn, monkeypatch
):
    """A real spare process: handed a replica while its JVM and session start, it shows that
    replica's command line before it is warm, so a stop or a fault reaches it; when it dies
    there, the agent releases the machine's warm-up lock it held."""
    node = NODES[0]
    monkeypatch.setenv("BACKSTOP_NODE", node)
    spare_id = "spare-w"
    assert take_warmup_lock(redis_conn, MACHINE, spare_id, SPARE_START_TIMEOUT_S)
    pid = spares.start_spare(redis_conn, node, spare_id)
    args = ["--job", "job-w", "--stage", "count", "--replica-id", "count-9", "--node", node]
    try:
        assert spares.hand_to_spare(args, "count-9", "job-w") == pid
        wait_for(
            lambda: children.find_replica_process("count-9", "job-w") is not None, 20, "the replica"
        )
        assert children.find_replica_process("count-9", "job-w").pid == pid
        assert children.find_replica_process("count-9", "job-other") is None, "another job's id"
        assert "is warm" not in children.stage_log_path(spare_id).read_text(), "still warming up"
        assert not agent.kill_replica("count-9", job_key="job-other")
        assert agent.kill_replica("count-9", job_key="job-w")
        wait_for(lambda: not psutil.pid_exists(pid) or is_zombie(pid), 20, "the spare killed")
        children.report_exits(redis_conn, node)
        assert take_warmup_lock(redis_conn, MACHINE, "spare-next", 5), "the lock was released"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        release_warmup_lock(redis_conn, MACHINE, "spare-next")
        release_warmup_lock(redis_conn, MACHINE, spare_id)
        with children._children_lock:
            children._children.pop(("job-w", "count-9"), None)
            children._taken_while_warming.pop(("job-w", "count-9"), None)
        events = redis_conn.xrange(control_keys.agent_events())
        exits = [event_id for event_id, event in events if event.get("job") == "job-w"]
        if exits:
            redis_conn.xdel(control_keys.agent_events(), *exits)
        redis_conn.delete(data_keys.spare_control(node, spare_id))


def test_a_warming_spare_runs_normally_only_when_needed_and_yields_only_if_it_can_come_back():
    assert spare.warming_nice(held=False, needed=True, can_raise=True) == 0
    # Re-protection under way: below the replica catching up, yet not at the bottom (a spare
    # needed for the next fault must get warm before it).
    assert spare.warming_nice(held=True, needed=True, can_raise=True) == NEEDED_SPARE_HELD_NICE
    assert spare.warming_nice(held=True, needed=False, can_raise=True) == SPARE_NICE
    assert spare.warming_nice(held=False, needed=False, can_raise=True) == SPARE_NICE
    # Without CAP_SYS_NICE or RLIMIT_NICE 20 it could not go back to 0 for its replica.
    assert spare.warming_nice(held=True, needed=False, can_raise=False) == 0


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="needs Linux autogroups")
@pytest.mark.skipif(not can_raise_priority(), reason="needs CAP_SYS_NICE or RLIMIT_NICE 20")
def test_a_spare_warming_up_yields_while_a_stage_is_re_protected_but_not_once_taken(
    redis_conn, monkeypatch
):
    """A real spare process, while its JVM and session start: it warms up at the lowest
    priority (process group and session) unless a spare is needed, the refill hold (a stage
    being re-protected) drops a needed one below the normal level, and a replica handed to it
    runs at the normal priority even under the hold (it is the replica catching up)."""
    node = NODES[0]
    monkeypatch.setenv("BACKSTOP_NODE", node)
    spare_id = "spare-v"
    assert take_warmup_lock(redis_conn, MACHINE, spare_id, SPARE_START_TIMEOUT_S)
    # Held for as long as the test may take (the agent's hold lasts 10 s unless renewed).
    hold, needed = data_keys.spare_refill_hold(), data_keys.spare_needed()
    # The spare's log is appended to: an earlier run's "is warm" must not count below.
    children.stage_log_path(spare_id).unlink(missing_ok=True)
    pid = spares.start_spare(redis_conn, node, spare_id)
    args = ["--job", "job-v", "--stage", "count", "--replica-id", "count-8", "--node", node]
    try:
        wait_for(lambda: priority(pid) == (SPARE_NICE, SPARE_NICE), 20, "a refill to yield")
        # Expiries as long as the test may take (the controller's last 10 s unless renewed).
        redis_conn.set(needed, "1", ex=120)
        wait_for(lambda: priority(pid) == (0, 0), 20, "a needed spare at the normal priority")
        redis_conn.set(hold, "1", ex=120)
        yielded = (NEEDED_SPARE_HELD_NICE, NEEDED_SPARE_HELD_NICE)
        wait_for(lambda: priority(pid) == yielded, 20, "yield to re-protection")
        redis_conn.delete(hold)
        wait_for(lambda: priority(pid) == (0, 0), 20, "the normal priority after the hold")
        redis_conn.set(hold, "1", ex=120)
        wait_for(lambda: priority(pid) == yielded, 20, "yield to re-protection")
        assert spares.hand_to_spare(args, "count-8", "job-v") == pid
        assert redis_conn.exists(hold), "taken under the hold"
        wait_for(lambda: priority(pid) == (0, 0), 20, "the replica at the normal priority")
        assert "is warm" not in children.stage_log_path(spare_id).read_text(), "still warming up"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        release_warmup_lock(redis_conn, MACHINE, spare_id)
        redis_conn.delete(needed)
        with children._children_lock:
            children._children.pop(("job-v", "count-8"), None)
            children._children.pop(("", spare_id), None)
            children._taken_while_warming.pop(("job-v", "count-8"), None)
        redis_conn.delete(data_keys.spare_control(node, spare_id))


def priority(pid: int) -> tuple[int, int] | None:
    """(nice level of the process group led by `pid`, nice level of its session's autogroup):
    the group's is its most favoured process's (getpriority(2)), so 19 means all of them."""
    try:
        group = os.getpriority(os.PRIO_PGRP, pid)
        with open(f"/proc/{pid}/autogroup") as autogroup:
            return group, int(autogroup.read().split()[-1])
    except (ProcessLookupError, FileNotFoundError):
        return None


def test_a_replica_handed_to_a_spare_is_found_before_the_spare_takes_its_command_line(
    redis_conn, monkeypatch
):
    """The agent's own spare, handed a replica, has not read its command yet (a spare idling at
    nice 19 on busy cores took over 260 ms): a retried start gets that spare's pid instead of a
    second process, and a kill reaches it. Before, the kill found nothing, the spare went on to
    become the replica and fenced the standby promoted in its place."""
    node = NODES[0]
    monkeypatch.setenv("BACKSTOP_NODE", node)
    monkeypatch.setattr(spares, "SPARE_MODULE", "tests.sleeping_spare")
    pid = spares.start_spare(redis_conn, node, "spare-u")
    redis_conn.hset(data_keys.spares(node), "spare-u", json.dumps({"pid": pid, "state": "idle"}))
    args = ["--job", "job-u", "--stage", "count", "--replica-id", "count-7", "--node", node]
    try:
        assert agent.start_replica(STAGE_MODULE, args, "count-7", "job-u", warm=True) == pid
        assert children.find_replica_process("count-7", "job-u") is None, "no command line yet"
        assert agent.start_replica(STAGE_MODULE, args, "count-7", "job-u", warm=True) == pid
        assert pid in [p.pid for p in children.node_stage_processes("job-u")], "a node fault's"
        assert pid not in [p.pid for p in children.node_stage_processes("job-other")]
        assert children.running_replica("count-7", "job-other") is None, "not another job's"
        assert not agent.kill_replica("count-7", job_key="job-other")
        assert agent.kill_replica("count-7", job_key="job-u")
        wait_for(lambda: not psutil.pid_exists(pid) or is_zombie(pid), 20, "the spare killed")
        assert not agent.kill_replica("count-7", job_key="job-u"), "gone"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        with children._children_lock:
            children._children.pop(("job-u", "count-7"), None)
            children._children.pop(("", "spare-u"), None)
        redis_conn.delete(data_keys.spare_control(node, "spare-u"))


def is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_yielding_spare_restarts_its_start_up_clock_and_keeps_the_warm_up_lock(redis_conn):
    """A refill at nice 19 is slow, not hung: while it yields, its entry's start time and the
    machine's warm-up lock it holds are renewed, so the agent does not replace it and no second
    spare starts warming beside it. Taken or idle, nothing is renewed."""
    node = NODES[0]
    long_ago = time.time() - SPARE_START_TIMEOUT_S - 60
    entry = {"pid": 4242, "state": "starting", "since": long_ago}
    redis_conn.hset(data_keys.spares(node), "spare-y", json.dumps(entry))
    assert take_warmup_lock(redis_conn, MACHINE, "spare-y", 5)
    try:
        assert spare.mark_yielding(redis_conn, MACHINE, node, "spare-y")
        renewed = json.loads(redis_conn.hget(data_keys.spares(node), "spare-y"))
        assert renewed["pid"] == 4242 and renewed["state"] == "starting"
        assert time.time() - renewed["since"] < 5
        assert spares.spares_to_take({"spare-y": renewed}, time.time()) == ["spare-y"]
        lock_ttl_ms = redis_conn.pttl(data_keys.spare_warmup_lock(MACHINE))
        assert lock_ttl_ms > (SPARE_START_TIMEOUT_S - 5) * 1000
        # Idle, or taken (its entry deleted): no clock to restart.
        redis_conn.hset(data_keys.spares(node), "spare-y", json.dumps({**entry, "state": "idle"}))
        assert not spare.mark_yielding(redis_conn, MACHINE, node, "spare-y")
        assert json.loads(redis_conn.hget(data_keys.spares(node), "spare-y"))["since"] == long_ago
        redis_conn.hdel(data_keys.spares(node), "spare-y")
        assert not spare.mark_yielding(redis_conn, MACHINE, node, "spare-y")
    finally:
        release_warmup_lock(redis_conn, MACHINE, "spare-y")


def test_agents_with_hosts_of_their_own_on_one_machine_warm_up_one_spare_at_a_time(
    redis_conn, monkeypatch
):
    """Simulated nodes stand for hosts of their own (BACKSTOP_NODE_HOST), as agents in
    containers have host names of their own, but they share the machine's cores: while a spare
    of one of them warms up, another starts none, since the two JVM starts would slow each
    other down; once that warm-up is over, it starts its own."""
    node = NODES[1]
    monkeypatch.setenv("BACKSTOP_NODE_HOST", node)
    started = []
    monkeypatch.setattr(spares, "start_spare", lambda client, node, spare_id: started.append(node))
    redis_conn.set(data_keys.spares_wanted(node), 1)
    # A spare of another agent of this machine holds its lock.
    assert take_warmup_lock(redis_conn, MACHINE, "spare-of-container-a", 30)
    try:
        spares.reconcile_spares(redis_conn, node)
        assert started == [], "a second warm-up on the machine"
        release_warmup_lock(redis_conn, MACHINE, "spare-of-container-a")
        spares.reconcile_spares(redis_conn, node)
        assert started == [node]
    finally:
        redis_conn.delete(data_keys.spare_warmup_lock(MACHINE))
