"""The kafka-broker fault: a Kafka broker Backstop started itself, stopped for N seconds and
started again on the same ports and data, by the process that owns it (docs/KAFKA.md, "The
kafka-broker fault").

Only the process that started a broker may stop and start it: it holds the broker's process
(a ProcessGroup child, or a KafkaBroker's own), and nobody else could start it again as that
owner's child. So the owner runs a `BrokerKeeper` thread beside its broker, and the controller
only asks:

- The keeper registers the broker under `keys.kafka_broker(bootstrap)` (JSON: address, pid,
  data directory, the keeper's random token, its process), renewed every second with a TTL of
  REGISTRATION_TTL_S. No registration: no broker of Backstop's own answers at that address (a
  cluster given by KAFKA_BOOTSTRAP_SERVERS, a broker `python -m infra.kafka ensure` left with no
  owner, an owner that is gone), and the fault is refused.
- The controller asks with `request_outage()`: a JSON record under
  `keys.kafka_broker_outage(bootstrap)` naming the fault, the job, the keeper's token and the
  duration. It is written only when no other outage of that broker is asked or under way (one
  outage at a time); asking again for the same fault changes nothing.
- The keeper carries it out once: the token must be its own (a request meant for an earlier
  owner is refused), `keys.fault_carried_out(fault)` is set NX first (a record written again
  never stops the broker twice), and the duration must be within its own bound
  (FAULT_MAX_DURATION_S). It writes the deadline before it acts (state `down`, `until`), stops
  the broker (SIGKILL, or SIGTERM for a clean shutdown), starts it again at the deadline on the
  same data directory and ports, and records when it answers again (state `up`, `back_at`). A
  refusal is recorded in the outage record and on the agent events stream, where the job's
  controller marks the fault refused, as for a node agent's refusal.

No Django: the launcher and the tests' cluster run it before or beside any settings.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import asdict, dataclass

import redis

from infra import keys
from infra.kafka import KafkaBroker
from infra.process_group import ProcessGroup
from infra.redis_client import redis_client
from spark_runtime.env import env

log = logging.getLogger(__name__)

REGISTRATION_TTL_S = 10  # a registration outlives its keeper by this much at most
REGISTER_EVERY_S = 1.0
POLL_S = 0.25  # how often the keeper looks for an outage asked of its broker
START_TIMEOUT_S = 120.0  # for the broker to answer again after an outage
# Outage records are kept this long after they are written (the last one is there to read).
OUTAGE_TTL_S = keys.FAULT_MARK_TTL_S
DEFAULT_MAX_DOWN_S = 600.0

ASKED, DOWN, UP, REFUSED = "asked", "down", "up", "refused"

# Writes the outage record (ARGV[1]) unless another fault's outage is asked or under way;
# returns the record found instead (the same fault's, or the other one's), or false.
REQUEST_LUA = """
local current = redis.call('GET', KEYS[1])
if current then
  local found = cjson.decode(current)
  if tostring(found.fault) == ARGV[2] or found.state == 'asked' or found.state == 'down' then
    return current
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[3]))
return false
"""


@dataclass(frozen=True)
class Registration:
    """A broker Backstop runs, as its keeper registered it."""

    bootstrap: str
    pid: int | None  # None while it is down for an outage
    data_dir: str
    token: str  # the keeper's: an outage request must name it
    owner_pid: int
    host: str
    supervisor: str  # who starts it again: "process-group" (ProcessGroup child) or "owner"
    down_until: float | None = None  # epoch s, while an outage holds it down


@dataclass(frozen=True)
class Outage:
    """An outage asked of a broker, and what became of it."""

    fault: int
    job: str
    token: str
    duration_s: float
    hard: bool  # SIGKILL (True) or SIGTERM, a clean shutdown
    state: str = ASKED
    asked_at: float = 0.0
    down_at: float | None = None
    until: float | None = None
    back_at: float | None = None
    detail: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Outage:
        return cls(**json.loads(raw))


def registration(client: redis.Redis, bootstrap: str) -> Registration | None:
    """The broker Backstop runs at `bootstrap` (its keeper's registration), or None."""
    raw = client.get(keys.kafka_broker(bootstrap))
    return Registration(**json.loads(raw)) if raw else None


def outage(client: redis.Redis, bootstrap: str) -> Outage | None:
    """The last outage asked of the broker at `bootstrap` (None: none in OUTAGE_TTL_S)."""
    raw = client.get(keys.kafka_broker_outage(bootstrap))
    return Outage.from_json(raw) if raw else None


class OutageRefused(Exception):
    """An outage that cannot be asked now; the message says why."""


def request_outage(
    client: redis.Redis,
    bootstrap: str,
    fault: int,
    job: str,
    duration_s: float,
    hard: bool = True,
) -> Outage:
    """Ask the keeper of the broker at `bootstrap` for an outage of `duration_s` seconds for
    `fault`. Idempotent: the same fault's request, already there, is returned as it is.
    Raises OutageRefused when no keeper has registered a broker there, or when another fault's
    outage of that broker is asked or under way."""
    found = registration(client, bootstrap)
    if found is None:
        raise OutageRefused(
            f"no broker of Backstop's own is registered at {bootstrap}: Backstop stops and "
            "starts only a broker it started itself and still keeps"
        )
    wanted = Outage(fault, job, found.token, float(duration_s), hard, ASKED, time.time())
    ttl = int(OUTAGE_TTL_S + duration_s)
    current = client.eval(
        REQUEST_LUA, 1, keys.kafka_broker_outage(bootstrap), wanted.to_json(), str(fault), ttl
    )
    if current is None:
        return wanted
    existing = Outage.from_json(current)
    if existing.fault == fault:
        return existing
    raise OutageRefused(
        f"the broker at {bootstrap} is already {existing.state} for fault #{existing.fault}: "
        "one outage at a time"
    )


# --- how a keeper stops and starts its broker ------------------------------------------------


class OwnedBroker:
    """A broker whose process the keeper's process started itself (KafkaBroker.start)."""

    supervisor = "owner"

    def __init__(self, broker: KafkaBroker):
        self.broker = broker

    @property
    def pid(self) -> int | None:
        return self.broker.pid

    def down(self, hard: bool, seconds: float) -> None:
        self.broker.kill() if hard else self.broker.stop()

    def up(self, timeout_s: float) -> None:
        self.broker.start(timeout_s)

    def end_outage(self) -> None:
        """The keeper stops during an outage: the broker runs again before it returns."""
        self.up(START_TIMEOUT_S)


class GroupBroker:
    """A broker that is the child `name` of a ProcessGroup (infra.process_group): held down for the
    outage, so the group does not start it again before the outage is over."""

    supervisor = "process-group"

    def __init__(self, group: ProcessGroup, name: str, broker: KafkaBroker):
        self.group = group
        self.name = name
        self.broker = broker

    @property
    def pid(self) -> int | None:
        child = self.group.children.get(self.name)
        if child is None or child.proc.poll() is not None:
            return None
        return child.proc.pid

    def down(self, hard: bool, seconds: float) -> None:
        # Held a little longer than asked: the keeper itself releases it at the deadline.
        proc = self.group.hold(self.name, seconds + 5, signal.SIGKILL if hard else signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a clean shutdown that hangs: kill it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def up(self, timeout_s: float) -> None:
        proc = self.group.release(self.name)
        self.broker.wait_ready(timeout_s, proc=proc)

    def end_outage(self) -> None:
        """The keeper stops during an outage (its group stops next): the hold ends, and the
        group starts the broker again if it still runs."""
        self.group.release(self.name)


# --- the keeper ------------------------------------------------------------------------------


def max_down_s() -> float:
    """The longest outage a keeper carries out (the faults' bound, FAULT_MAX_DURATION_S)."""
    return env("FAULT_MAX_DURATION_S", DEFAULT_MAX_DOWN_S, float)


class BrokerKeeper:
    """Registers a broker Backstop started and carries out the outages asked of it (see the
    module's docstring). `control`: an OwnedBroker or a GroupBroker. Run it with `start()`;
    `stop()` ends it, starting the broker again first if an outage holds it down."""

    def __init__(self, control, redis_url: str, data_dir, bootstrap: str):
        self.control = control
        self.redis_url = redis_url
        self.data_dir = str(data_dir)
        self.bootstrap = bootstrap
        self.token = uuid.uuid4().hex
        self.current: Outage | None = None  # the outage holding the broker down, if any
        self._registered_at = 0.0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = redis_client(redis_url)

    @classmethod
    def for_broker(cls, broker: KafkaBroker, redis_url: str) -> BrokerKeeper:
        return cls(OwnedBroker(broker), redis_url, broker.data_dir, broker.bootstrap_servers)

    @classmethod
    def for_group_child(
        cls, group: ProcessGroup, name: str, broker: KafkaBroker, redis_url: str
    ) -> BrokerKeeper:
        control = GroupBroker(group, name, broker)
        return cls(control, redis_url, broker.data_dir, broker.bootstrap_servers)

    def start(self) -> BrokerKeeper:
        self.register()
        self._thread = threading.Thread(target=self._loop, name="kafka-keeper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop keeping the broker: it runs again (an outage under way ends now), and its
        registration is withdrawn (the fault is refused against it from then on)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=START_TIMEOUT_S + 10)
        if self.current is not None:
            self.control.end_outage()
            self.current = None
        with contextlib.suppress(redis.RedisError):
            self._client.delete(keys.kafka_broker(self.bootstrap))
        self._client.close()

    def _loop(self) -> None:
        while not self._stopping.wait(POLL_S):
            try:
                self.tick()
            except redis.RedisError as exc:
                log.warning("kafka keeper %s: Redis error (retrying): %s", self.bootstrap, exc)
            except RuntimeError as exc:  # the broker did not answer in time: tried again
                log.error("kafka keeper %s: %s", self.bootstrap, exc)
            except Exception:  # a keeper that stops would leave its broker down: log, go on
                log.exception("kafka keeper %s: unexpected error (going on)", self.bootstrap)

    def register(self) -> None:
        entry = Registration(
            bootstrap=self.bootstrap,
            pid=self.control.pid,
            data_dir=self.data_dir,
            token=self.token,
            owner_pid=os.getpid(),
            host=socket.gethostname(),
            supervisor=self.control.supervisor,
            down_until=self.current.until if self.current else None,
        )
        self._client.set(
            keys.kafka_broker(self.bootstrap), json.dumps(asdict(entry)), ex=REGISTRATION_TTL_S
        )
        self._registered_at = time.monotonic()

    def tick(self) -> None:
        """One look: renew the registration, end an outage that is over, start one asked."""
        if time.monotonic() - self._registered_at >= REGISTER_EVERY_S:
            self.register()
        if self.current is not None:
            if time.time() >= self.current.until:
                self.bring_up()
            return
        asked = outage(self._client, self.bootstrap)
        if asked is not None and asked.state == ASKED:
            self.carry_out(asked)

    def _save(self, record: Outage) -> None:
        self._client.set(
            keys.kafka_broker_outage(self.bootstrap),
            record.to_json(),
            ex=int(OUTAGE_TTL_S + record.duration_s),
        )

    def refuse(self, asked: Outage, why: str, report: bool = True) -> None:
        """Record that the outage was not carried out, and (`report`) tell the job's controller,
        which marks the fault refused."""
        self._save(Outage(**{**asdict(asked), "state": REFUSED, "detail": why}))
        if not report:
            return
        self._client.xadd(
            keys.agent_events(),
            {"kind": keys.EVENT_REFUSED, "node": f"kafka {self.bootstrap}",
             "fault": "kafka-broker", "detail": why, "fault_id": str(asked.fault),
             "job": asked.job, "at": str(time.time())},
            maxlen=keys.AGENT_EVENTS_MAXLEN,
            approximate=True,
        )  # fmt: skip
        log.warning("kafka keeper %s refuses fault %s: %s", self.bootstrap, asked.fault, why)

    def carry_out(self, asked: Outage) -> None:
        """Take the broker down for the outage asked (once per fault)."""
        if asked.token != self.token:
            self.refuse(asked, "asked of an earlier keeper of this broker (its owner restarted)")
            return
        top = max_down_s()
        if not 0 < asked.duration_s <= top:
            self.refuse(asked, f"duration_s must be more than 0 and at most {top:g} s")
            return
        mark = keys.fault_carried_out(asked.fault)
        if not self._client.set(mark, self.token, nx=True, ex=keys.FAULT_MARK_TTL_S):
            # Written again after it was carried out: never twice (and the fault stays injected).
            self.refuse(asked, f"fault #{asked.fault} was carried out already", report=False)
            return
        now = time.time()
        # The deadline first: what the registration and the record say while it is down.
        self.current = Outage(
            **{**asdict(asked), "state": DOWN, "down_at": now, "until": now + asked.duration_s}
        )
        self._save(self.current)
        self.register()
        how = "SIGKILL" if asked.hard else "SIGTERM"
        log.warning(
            "kafka keeper %s: %s to the broker (pid %s) for fault %s, down %g s",
            self.bootstrap, how, self.control.pid, asked.fault, asked.duration_s,
        )  # fmt: skip
        self.control.down(asked.hard, asked.duration_s)
        self.register()  # without a pid now

    def bring_up(self) -> None:
        """Start the broker again on its data directory and ports; record when it answers."""
        self.control.up(START_TIMEOUT_S)
        back = Outage(**{**asdict(self.current), "state": UP, "back_at": time.time()})
        self.current = None
        with contextlib.suppress(redis.RedisError):
            self._save(back)
            self.register()
        log.warning(
            "kafka keeper %s: the broker answers again (pid %s), %.1f s after it went down",
            self.bootstrap, self.control.pid, back.back_at - back.down_at,
        )  # fmt: skip
