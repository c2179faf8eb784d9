"""The give-up rule on causes (spark_runtime/failover.py, ExponentialDelayRestartBackoff): a
scope that fails `same_cause_failures_limit` times in a row with the same reported cause is given
up on, however far apart the failures are; another cause, a failure without a cause and a
success start the count again. Pure: synthetic events, no Django, no Spark, no Redis (but for
the last two tests: what a driver reads from Redis, and what a stage that cannot start writes
there)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from spark_runtime import keys
from spark_runtime.failover import CauseStreak, ExponentialDelayRestartBackoff, RestartPolicy
from spark_runtime.replicas import (
    JOB,
    STANDBY_PROTECTION,
    GiveUp,
    HeartbeatMissed,
    HeartbeatSeen,
    KillReplica,
    ProcessExited,
    RestartStage,
    ScheduleRestart,
    reported_cause,
)
from spark_runtime.runner import observe
from spark_runtime.supervision import Supervisor

NODES = ["node-1", "node-2", "node-3"]
PYARROW = "ModuleNotFoundError: No module named 'pyarrow'"
SCOPE = "count/primary"


def backoff(**policy) -> ExponentialDelayRestartBackoff:
    return ExponentialDelayRestartBackoff(RestartPolicy(**policy), {}, {})


# --- the restart-backoff strategy ------------------------------------------------------------


def test_the_same_cause_three_times_in_a_row_gives_up_however_far_apart():
    strategy = backoff(max_failures=8, failure_window_s=600, same_cause_failures_limit=3)
    # An hour apart: never two failures in the same window, so the failure rate never counts 8.
    for at in (0.0, 3600.0):
        strategy.notify_failure(SCOPE, at, cause=PYARROW)
        assert strategy.can_restart(SCOPE)
        assert strategy.repeated_cause(SCOPE) is None
    strategy.notify_failure(SCOPE, 7200.0, cause=PYARROW)
    assert strategy.failures[SCOPE] == [7200.0]  # the failure-rate rule sees one failure
    assert not strategy.can_restart(SCOPE)
    assert strategy.repeated_cause(SCOPE) == CauseStreak(PYARROW, 3)


def test_another_cause_or_a_failure_without_one_starts_the_count_again():
    strategy = backoff(max_failures=100, same_cause_failures_limit=3)
    for cause in (PYARROW, PYARROW, "ValueError: bad row", PYARROW, PYARROW):
        strategy.notify_failure(SCOPE, 0.0, cause=cause)
        assert strategy.can_restart(SCOPE), cause
    assert strategy.streaks[SCOPE] == CauseStreak(PYARROW, 2)
    strategy.notify_failure(SCOPE, 1.0)  # killed: it said nothing
    assert SCOPE not in strategy.streaks
    strategy.notify_failure(SCOPE, 2.0, cause=PYARROW)
    strategy.notify_failure(SCOPE, 3.0, cause=PYARROW)
    assert strategy.can_restart(SCOPE)
    strategy.notify_failure(SCOPE, 4.0, cause=PYARROW)
    assert not strategy.can_restart(SCOPE)


def test_a_success_starts_the_count_again():
    strategy = backoff(same_cause_failures_limit=3)
    strategy.notify_failure(SCOPE, 0.0, cause=PYARROW)
    strategy.notify_failure(SCOPE, 1.0, cause=PYARROW)
    strategy.notify_success(SCOPE)
    strategy.notify_failure(SCOPE, 2.0, cause=PYARROW)
    strategy.notify_failure(SCOPE, 3.0, cause=PYARROW)
    assert strategy.can_restart(SCOPE)
    strategy.notify_failure(SCOPE, 4.0, cause=PYARROW)
    assert strategy.repeated_cause(SCOPE) == CauseStreak(PYARROW, 3)


def test_scopes_are_counted_apart_and_a_limit_of_one_gives_up_on_the_first_reported_cause():
    strategy = backoff(same_cause_failures_limit=1)
    strategy.notify_failure("count/standby", 0.0)  # no cause: only the failure rate counts it
    assert strategy.can_restart("count/standby")
    strategy.notify_failure(SCOPE, 0.0, cause=PYARROW)
    assert not strategy.can_restart(SCOPE)
    assert strategy.can_restart("count/standby")
    assert strategy.can_restart("split/primary")


def test_the_failure_rate_rule_still_gives_up_on_different_causes():
    strategy = backoff(max_failures=3, failure_window_s=60, same_cause_failures_limit=3)
    for at, cause in ((0.0, "A: a"), (10.0, "B: b"), (20.0, "")):
        strategy.notify_failure(SCOPE, at, cause=cause)
    assert not strategy.can_restart(SCOPE)
    assert strategy.repeated_cause(SCOPE) is None  # the failure rate did it


def test_the_delays_are_the_backoffs_whatever_the_causes():
    strategy = backoff(initial_delay_s=2, max_delay_s=60, same_cause_failures_limit=3)
    strategy.notify_failure(SCOPE, 0.0, cause=PYARROW)
    assert [strategy.backoff_s(n) for n in range(1, 5)] == [0, 2, 4, 8]


# --- the supervisor --------------------------------------------------------------------------


def crash_loop(sup: Supervisor, replica_id: str, cause: str, fail_after_s: float, limit: int):
    """Every start of `replica_id` fails `fail_after_s` after it with `cause` (a process exit
    with code 1), the backoff's delays waited out through tick(). Returns (starts, the time of
    the give-up or None, the GiveUp or None) after at most `limit` failures."""
    starts = 1
    for _ in range(limit):
        now = sup.replicas[replica_id].launched_at + fail_after_s
        actions = sup.handle(ProcessExited(replica_id, now, 1, cause=cause))
        if isinstance(actions[-1], GiveUp):
            return starts, now, actions[-1]
        if isinstance(actions[0], ScheduleRestart):
            assert sup.tick(actions[0].at - 0.01) == []
            actions = sup.tick(actions[0].at)
        assert isinstance(actions[0], RestartStage), actions
        starts += 1
    return starts, None, None


def test_a_stage_failing_the_same_way_every_start_is_given_up_on_at_its_third_failure():
    """The issue's case: every start of the stage fails about 50 s after it, the same way."""
    sup = Supervisor("j", "wordcount", {"count": ("split", "count")}, "local-restart", NODES)
    sup.start(0.0)
    starts, at, verdict = crash_loop(sup, "count-1", PYARROW, 50.0, limit=20)
    # Started at 0, failed at 50 (restarted at once), at 100 (restart in 2 s), at 152: given up.
    assert (starts, at) == (3, 152.0)
    assert verdict == GiveUp(
        "count",
        JOB,
        "count: primary failed 3 times in a row with the same cause: ModuleNotFoundError: No "
        "module named 'pyarrow'; not restarting (policy same_cause_failures_limit=3)",
    )
    assert sup.gave_up == verdict.reason
    assert sup.live() == [] and sup.tick(10_000.0) == []
    failed = [what for _, what in sup.history if "failed:" in what]
    assert failed == [f"count-1 (primary of count) failed: process exited (1): {PYARROW}"] * 3


def test_without_the_rule_a_slow_deterministic_failure_restarts_for_ever():
    # What the failure rate alone did: starts that fail 80 s in, spaced by delays up to 60 s,
    # never reach 8 failures in 600 s.
    policy = RestartPolicy(same_cause_failures_limit=1000)
    sup = Supervisor("j", "wordcount", {"count": ("count",)}, "local-restart", NODES,
                     restart_policy=policy)  # fmt: skip
    sup.start(0.0)
    starts, at, _ = crash_loop(sup, "count-1", PYARROW, 80.0, limit=40)
    assert (starts, at) == (41, None)
    # The same loop with the default policy ends at the third failure.
    sup = Supervisor("j", "wordcount", {"count": ("count",)}, "local-restart", NODES)
    sup.start(0.0)
    assert crash_loop(sup, "count-1", PYARROW, 80.0, limit=40)[:2] == (3, 242.0)


def test_the_failure_rate_reason_stays_when_the_causes_differ():
    policy = RestartPolicy(initial_delay_s=1, max_failures=3, failure_window_s=60)
    sup = Supervisor("j", "wordcount", {"count": ("count",)}, "local-restart", NODES,
                     restart_policy=policy)  # fmt: skip
    sup.start(0.0)
    sup.handle(ProcessExited("count-1", 10.0, 1, cause="A: a"))
    sup.handle(ProcessExited("count-1", 11.0, 1, cause="B: b"))
    sup.tick(12.0)
    actions = sup.handle(ProcessExited("count-1", 13.0, 1, cause="A: a"))
    assert actions[-1].reason == (
        "count: 3 primary failures within 60 s (last: count-1, process exited (1): A: a)"
    )


def fail(sup: Supervisor, replica_id: str, at: float, cause: str = "", code: int = 1) -> list:
    """The restarts due by `at`, then `replica_id`'s process exits at `at` with `cause`."""
    sup.tick(at)
    return sup.handle(ProcessExited(replica_id, at, code, cause=cause))


def test_a_batch_or_another_failure_between_the_same_causes_starts_the_count_again():
    policy = RestartPolicy(max_failures=100)
    sup = Supervisor("j", "wordcount", {"count": ("count",)}, "local-restart", NODES,
                     restart_policy=policy)  # fmt: skip
    sup.start(0.0)
    fail(sup, "count-1", 10.0, PYARROW)
    fail(sup, "count-1", 20.0, PYARROW)
    sup.tick(22.0)
    # The restart finishes a batch (a heartbeat of the process started after the restart).
    entry = {"state": "running", "role": "primary", "batches": 1, "started_at": 22.5}
    sup.handle(HeartbeatSeen("count-1", 30.0, entry))
    assert sup.cause_streaks == {}
    fail(sup, "count-1", 40.0, PYARROW)
    fail(sup, "count-1", 50.0, PYARROW)
    fail(sup, "count-1", 60.0, code=-9)  # killed: nothing says it will happen again
    fail(sup, "count-1", 70.0, PYARROW)
    fail(sup, "count-1", 90.0, PYARROW)
    assert sup.gave_up is None
    actions = fail(sup, "count-1", 110.0, PYARROW)
    assert isinstance(actions[-1], GiveUp) and "failed 3 times in a row" in actions[-1].reason


def test_a_replica_that_reported_its_failure_fails_at_once_whatever_its_heartbeat_says():
    sup = Supervisor("j", "wordcount", {"count": ("count",)}, "local-restart", NODES,
                     hung_timeout_s=30)  # fmt: skip
    sup.start(0.0)
    # Within its start-up grace, silent: nothing yet; silent with a reported failure: failed.
    assert sup.handle(HeartbeatMissed("count-1", 20.0)) == []
    assert sup.handle(HeartbeatMissed("count-1", 21.0, cause=PYARROW)) == [
        RestartStage(sup.replicas["count-1"].spec)
    ]
    # Busy (its JVM still shutting down) with a reported failure: failed, not slow.
    (action,) = sup.handle(HeartbeatMissed("count-1", 40.0, busy=True, cause=PYARROW))
    assert isinstance(action, ScheduleRestart) and sup.slow() == []
    assert sup.history[-2][1].endswith(f"failed: heartbeat missed: {PYARROW}")


def test_standbys_failing_the_same_way_leave_the_stage_unprotected():
    sup = Supervisor("j", "wordcount", {"count": ("count",)}, "adaptive", NODES, {"count"})
    sup.start(0.0)
    sup.handle(HeartbeatSeen("count-1", 1.0, {"state": "running", "role": "primary"}))
    fail(sup, "count-2", 5.0, PYARROW)
    fail(sup, "count-2", 6.0, PYARROW)
    actions = fail(sup, "count-2", 10.0, PYARROW)
    assert actions == [
        KillReplica("count-2"),
        GiveUp(
            "count",
            STANDBY_PROTECTION,
            "count: standby failed 3 times in a row with the same cause: ModuleNotFoundError: "
            "No module named 'pyarrow'; not restarting (policy same_cause_failures_limit=3)",
        ),
    ]
    assert sup.gave_up is None and "count" in sup.unprotectable


def test_the_streaks_survive_a_snapshot_and_a_relaunch_forgets_them():
    sup = Supervisor("j", "wordcount", {"count": ("count",)}, "local-restart", NODES)
    sup.start(0.0)
    sup.handle(ProcessExited("count-1", 10.0, 1, cause=PYARROW))
    sup.handle(ProcessExited("count-1", 20.0, 1, cause=PYARROW))
    snapshot = json.loads(json.dumps(sup.to_dict()))
    assert snapshot["cause_streaks"] == {SCOPE: {"cause": PYARROW, "count": 2}}
    restored = Supervisor.from_dict(snapshot)
    assert restored.cause_streaks == {SCOPE: CauseStreak(PYARROW, 2)}
    restored.tick(22.0)
    actions = restored.handle(ProcessExited("count-1", 30.0, 1, cause=PYARROW))
    assert isinstance(actions[-1], GiveUp)
    restored.relaunch(100.0)
    assert restored.cause_streaks == {}
    # A snapshot written before the rule existed loads with no streaks and the default limit.
    older = {k: v for k, v in snapshot.items() if k != "cause_streaks"}
    older["restart_policy"] = {
        k: v for k, v in older["restart_policy"].items() if k != "same_cause_failures_limit"
    }
    restored = Supervisor.from_dict(older)
    assert restored.cause_streaks == {}
    assert restored.restart_policy.same_cause_failures_limit == 3


def test_reported_cause_reads_only_a_failure_of_the_current_run():
    failed = {"state": "failed", "error": PYARROW, "started_at": 100.0, "failed_at": 150.0}
    assert reported_cause(failed, launched_at=100.5) == PYARROW  # within the clock slack
    assert reported_cause({**failed, "state": "lost"}, 100.0) == PYARROW  # marked by a driver
    assert reported_cause({**failed, "state": "running"}, 100.0) == ""
    assert reported_cause({**failed, "error": ""}, 100.0) == ""
    assert reported_cause(None, 100.0) == ""
    # An earlier run's entry: it started before the relaunch, or (a process that failed within
    # a second of its start) it failed before it.
    assert reported_cause(failed, launched_at=150.0) == ""
    assert reported_cause({**failed, "failed_at": 100.4}, launched_at=100.5) == ""


class FakeLauncher:
    """A launcher whose processes are alive unless listed as exited."""

    def __init__(self):
        self.exited: dict[str, int] = {}
        self.asked_busy: list[str] = []

    def alive(self, replica_id):
        return replica_id not in self.exited

    def exit_code(self, replica_id):
        return self.exited.get(replica_id)

    def busy(self, replica_id):
        self.asked_busy.append(replica_id)
        return True


def test_observe_hands_the_supervisor_the_cause_a_replica_wrote(redis_conn, job):
    sup = Supervisor(job, "wordcount", {"split": ("split",), "count": ("count",)},
                     "local-restart", NODES)  # fmt: skip
    now = time.time()
    sup.start(now)
    launcher = FakeLauncher()
    for replica_id in ("split-1", "count-1"):  # what a stage writes when its query failed
        entry = {"state": "failed", "error": f"{replica_id} broke", "started_at": now + 1,
                 "failed_at": now + 3}  # fmt: skip
        redis_conn.hset(keys.replicas(job), replica_id, json.dumps(entry))
    launcher.exited["count-1"] = 1
    events = observe(sup, launcher, redis_conn, job, now + 5)
    assert events == [
        HeartbeatMissed("split-1", now + 5, busy=False, cause="split-1 broke"),
        ProcessExited("count-1", now + 5, 1, cause="count-1 broke"),
    ]
    assert launcher.asked_busy == []  # a replica that said it failed is not slow
    # An entry of an earlier run says nothing about this one.
    sup.replicas["split-1"].launched_at = now + 10
    (event, _) = observe(sup, launcher, redis_conn, job, now + 15)
    assert event == HeartbeatMissed("split-1", now + 15, busy=True)


def test_a_stage_that_cannot_start_its_queries_reports_why_and_exits_at_once(
    redis_conn, redis_url, job
):
    # An unknown topology fails before any Spark: the cause is the exception's line.
    args = ["--job", job, "--topology", "no-such-topology", "--stage", "count", "--operators",
            "count", "--replica-id", "count-1", "--redis-url", redis_url]  # fmt: skip
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "spark_runtime.stage", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "could not start its queries" in done.stderr
    entry = json.loads(redis_conn.hget(keys.replicas(job), "count-1"))
    assert entry["state"] == "failed"
    assert entry["error"].startswith("KeyError: \"unknown topology 'no-such-topology'")
    assert started <= entry["started_at"] <= entry["failed_at"] <= time.time()
    assert reported_cause(entry, launched_at=started) == entry["error"]
    assert not redis_conn.exists(keys.heartbeat(job, "count-1"))
