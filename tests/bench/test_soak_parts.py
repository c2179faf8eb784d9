"""The pure parts of `manage.py soak` (bench/soak/): its seeded schedule, the process classifier,
the goals judged on a report, and the report's keys. No Spark, no cluster, no database."""

import json
from collections import Counter

import pytest

from bench.soak import report
from bench.soak.processes import ProcRow, base_kind, classify, process_rows, totals, unowned
from bench.soak.run import parse_policy, set_run_policy
from bench.soak.schedule import (
    CONTROL_PLANE,
    EVENT_KINDS,
    JOB_FAULTS,
    KAFKA_FAULTS,
    event_kinds,
    event_rng,
    parse_spacing,
    pick,
    plan_schedule,
)
from console.models import Policy

# --- schedule ---------------------------------------------------------------------------------


def test_same_seed_same_schedule_and_another_seed_another():
    first = plan_schedule(11, 3600)
    assert first == plan_schedule(11, 3600)
    assert [(e.at_s, e.kind) for e in first] != [(e.at_s, e.kind) for e in plan_schedule(12, 3600)]


def test_events_are_spaced_within_the_bounds_and_inside_the_run():
    for seed in range(20):
        events = plan_schedule(seed, 3600, (60, 120))
        times = [0.0] + [e.at_s for e in events]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        # at_s is rounded to a tenth: allow that much either side.
        assert all(59.9 <= gap <= 120.1 for gap in gaps), gaps
        assert times[-1] < 3600
        # The last event is the last one that fits: one more gap would pass the end.
        assert 3600 - times[-1] <= 120.1
        assert [e.number for e in events] == list(range(1, len(events) + 1))


def test_a_long_schedule_holds_every_kind_and_any_ten_events_hold_each_once():
    assert set(EVENT_KINDS) == set(JOB_FAULTS) | set(CONTROL_PLANE)
    assert len(EVENT_KINDS) == 10
    assert set(JOB_FAULTS) == {
        "kill-driver",
        "kill-standby",
        "kill-node",
        "pause-node",
        "stress-node",
        "operator-exception",
    }
    for seed in range(10):
        kinds = [e.kind for e in plan_schedule(seed, 3600)]
        assert len(kinds) >= 30  # 3600 s at most 120 s apart
        assert set(kinds) == set(EVENT_KINDS)
        # Dealt from a shuffled deck: each block of ten is every kind once.
        for start in range(0, len(kinds) - 9, 10):
            assert Counter(kinds[start : start + 10]) == Counter(EVENT_KINDS)


def test_a_run_with_a_job_on_kafka_also_deals_the_kafka_broker_fault():
    assert event_kinds() == EVENT_KINDS
    kinds = event_kinds(kafka=True)
    assert kinds == EVENT_KINDS + KAFKA_FAULTS == (*EVENT_KINDS, "kafka-broker")
    for seed in range(5):
        dealt = [e.kind for e in plan_schedule(seed, 3600, kinds=kinds)]
        for start in range(0, len(dealt) - 10, 11):
            assert Counter(dealt[start : start + 11]) == Counter(kinds)
    # Without a job on Kafka the schedule is the one it always was.
    assert plan_schedule(3, 3600) == plan_schedule(3, 3600, kinds=event_kinds(kafka=False))


def test_spacing_option_is_checked():
    assert parse_spacing("40,60") == (40.0, 60.0)
    for bad in ("60", "a,b", "60,40", "5,20"):
        with pytest.raises(ValueError, match="--spacing"):
            parse_spacing(bad)


def test_target_pick_depends_on_the_seed_and_event_not_on_the_order_read():
    candidates = [("topn", "node-2"), ("wordcount", "count"), ("activity", "per_window")]
    picked = pick(event_rng(7, 3), candidates)
    assert picked == pick(event_rng(7, 3), list(reversed(candidates)))
    assert picked in candidates
    assert pick(event_rng(7, 3), []) is None
    # Over events, every candidate comes up.
    assert {pick(event_rng(7, n), candidates) for n in range(1, 40)} == set(candidates)


# --- process classifier -----------------------------------------------------------------------

JAVA = "/usr/lib/jvm/java-17-openjdk-amd64/bin/java -cp /x org.apache.spark.deploy.SparkSubmit"
PY = "/work/main/.venv/bin/python"


@pytest.mark.parametrize(
    ("cmdline", "kind"),
    [
        (
            [
                "[celeryd: soak-controller@vm:MainProcess] -active- (-A web worker -Q control -n "
                "soak-controller@%h --pool threads --concurrency 4 --loglevel INFO)"
            ],
            "controller",
        ),  # fmt: skip
        ([PY, "-m", "celery", "-A", "web", "worker", "-Q", "control"], "controller"),
        (
            [PY, "-m", "celery", "-A", "web", "worker", "-Q", "node.node-2", "--pool", "solo"],
            "agent",
        ),
        (["[celery beat] -A web beat --loglevel INFO --schedule /tmp/beat"], "beat"),
        ([PY, "-m", "spark_runtime.stage", "--job", "job-1", "--role", "primary"], "primary"),
        ([PY, "-m", "spark_runtime.stage", "--job", "job-1", "--role", "standby"], "standby"),
        ([PY, "-m", "spark_runtime.spare", "--spare-id", "s1", "--node", "node-1"], "spare"),
        ([PY, "-m", "spark_runtime", "generate", "--job", "job-1", "--rate", "20"], "generator"),
        ([PY, "-m", "workers.cpu_hog", "10", "node-1"], "cpu-hog"),
        (
            [PY, "-m", "spark_runtime.class_sharing_build", "--redis-url", "redis://h/0"],
            "archive-build",
        ),
        ([PY, "-m", "pyspark.daemon", "pyspark.worker"], "python-worker"),
        (JAVA.split(), "jvm"),
        (["/usr/bin/java", "-cp", "/k/libs/a.jar", "kafka.Kafka", "/k/server.properties"], "kafka"),
        (["/usr/bin/redis-server", "127.0.0.1:6379"], "redis"),
        (["redis-server 127.0.0.1:38281"], "redis"),
        (["/usr/lib/postgresql/15/bin/postgres", "-D", "/tmp/data"], "postgres"),
        (["postgres: checkpointer "], "postgres"),
        (["/bin/bash", "-c", "sleep 1"], None),
        ([PY, "-m", "celery", "-A", "other", "worker", "-Q", "control"], None),
        ([], None),
    ],
)
def test_base_kind_from_the_command_line(cmdline, kind):
    assert base_kind(cmdline) == kind


def stage(pid, ppid, role="primary", job="job-1", replica="count-1"):
    argv = (PY, "-m", "spark_runtime.stage", "--job", job, "--role", role, "--replica-id", replica)
    return ProcRow(pid, ppid, argv, rss_mb=100.0, fds=20, private_mb=60.0)


def test_jvms_count_as_their_stage_or_spare_and_orphans_are_found():
    rows = [
        ProcRow(10, 1, (PY, "-m", "celery", "-A", "web", "worker", "-Q", "node.node-1"), 300, 50),
        stage(20, 10),
        ProcRow(21, 20, tuple(JAVA.split()), rss_mb=500.0, fds=200, private_mb=420.0),
        ProcRow(22, 21, (PY, "-m", "pyspark.daemon"), rss_mb=80.0, fds=10),
        ProcRow(23, 22, (PY, "-m", "pyspark.daemon"), rss_mb=60.0, fds=10),
        stage(30, 10, role="standby", replica="count-2"),
        ProcRow(31, 30, tuple(JAVA.split()), rss_mb=400.0, fds=150),
        ProcRow(40, 10, (PY, "-m", "spark_runtime.spare", "--spare-id", "s1"), 90, 10),
        ProcRow(41, 40, tuple(JAVA.split()), rss_mb=300.0, fds=100),
        # The class-data archive's builder, an agent's child, and its JVM (a soak's first two
        # samples held it as an orphan of 1 GB before it had a kind).
        ProcRow(45, 10, (PY, "-m", "spark_runtime.class_sharing_build", "--redis-url", "r"), 90),
        ProcRow(46, 45, tuple(JAVA.split()), rss_mb=600.0, fds=100),
        # A JVM and a Python worker whose stage is gone (reparented to init).
        ProcRow(50, 1, tuple(JAVA.split()), rss_mb=200.0, fds=80),
        ProcRow(51, 1, (PY, "-m", "pyspark.daemon"), rss_mb=50.0, fds=5),
        ProcRow(60, 1, ("/bin/bash",), rss_mb=5.0, fds=3),
    ]
    kinds = classify(rows)
    assert kinds == {
        10: "agent",
        20: "primary",
        21: "primary",
        22: "python-worker",
        23: "python-worker",
        30: "standby",
        31: "standby",
        40: "spare",
        41: "spare",
        45: "archive-build",
        46: "archive-build",
        50: "orphan",
        51: "orphan",
    }
    assert totals(rows, kinds) == {
        "agent": {"processes": 1, "rss_mb": 300.0, "private_mb": 0.0, "fds": 50},
        "archive-build": {"processes": 2, "rss_mb": 690.0, "private_mb": 0.0, "fds": 100},
        "orphan": {"processes": 2, "rss_mb": 250.0, "private_mb": 0.0, "fds": 85},
        "primary": {"processes": 2, "rss_mb": 600.0, "private_mb": 480.0, "fds": 220},
        "python-worker": {"processes": 2, "rss_mb": 140.0, "private_mb": 0.0, "fds": 20},
        "spare": {"processes": 2, "rss_mb": 390.0, "private_mb": 0.0, "fds": 110},
        "standby": {"processes": 2, "rss_mb": 500.0, "private_mb": 60.0, "fds": 170},
    }
    # A promoted standby keeps its command line; its current role wins.
    assert classify(rows, roles_by_pid={30: "primary"})[31] == "primary"


def test_unowned_processes_are_orphans_and_those_of_stopped_jobs_or_ended_replicas():
    rows = [
        stage(20, 10, job="job-live", replica="count-1"),
        stage(30, 10, job="job-live", replica="count-2"),
        stage(40, 10, job="job-stopped", replica="count-1"),
        ProcRow(50, 1, tuple(JAVA.split())),
        ProcRow(60, 10, (PY, "-m", "spark_runtime", "generate", "--job", "job-stopped")),
    ]
    kinds = classify(rows)
    found = unowned(rows, kinds, live_jobs={"job-live"}, ended_replicas={"job-live/count-2"})
    assert [(p["pid"], p["kind"]) for p in found] == [
        (30, "primary"),
        (40, "primary"),
        (50, "orphan"),
        (60, "generator"),
    ]
    assert "ended" in found[0]["why"] and "not live" in found[1]["why"]


# --- goals and the report ---------------------------------------------------------------------


def sample(at_s, rss, rows=100, memory=10.0, keys=50):
    return {
        "at_s": at_s,
        "processes": {k: {"processes": 1, "rss_mb": v, "fds": 10} for k, v in rss.items()},
        "unowned": [],
        "db_rows": {"console_job": 3, "console_metricsample": rows},
        "redis": {"used_memory_mb": memory, "keys": keys, "keys_by_job": {}},
        "checkpoint_bytes": 2**20,
    }


def fault(number, kind, recovered=True, recovery_s=2.0, injected=True, at_s=100.0, **more):
    return {
        "number": number, "kind": kind, "target": "x", "at_s": at_s, "injected": injected,
        "recovered": recovered if injected else None, "recovery_s": recovery_s, "how": "",
        **more,
    }  # fmt: skip


def a_report(faults, audits, samples, leaked_processes=(), leaked_keys=(), duration_s=3600):
    base = {
        "minutes": duration_s / 60,
        "seed": 7,
        "faults": faults,
        "audits": audits,
        "leaked_processes": list(leaked_processes),
        "leaked_keys": list(leaked_keys),
        "rss_mb": report.rss_summary(samples, duration_s),
        "per_hour": report.per_hour(faults, audits, samples, duration_s),
    }
    base["goals"] = report.judge_goals(base)
    return base


def test_a_clean_run_meets_every_goal():
    samples = [
        sample(t, {"controller": 300, "primary": 1000 + t / 600}, rows=100 + t, keys=50)
        for t in range(0, 3601, 600)
    ]
    faults = [
        fault(1, "kill-driver", actions=["promote"], reprotect_s=40.0),
        fault(2, "controller-restart", recovery_s=9.5),
        fault(3, "kill-standby", recovery_s=80.0),
        fault(4, "operator-exception", recovery_s=25.0, actions=["restart-stage"]),
    ]
    faults.append(fault(5, "postgres-restart", injected=False))  # skipped: no target
    audits = [{"at_s": 300.0, "job": "wc", "lost": 0, "duplicates": 0, "cells": 10}]
    goals = a_report(faults, audits, samples)["goals"]
    assert {name: g["met"] for name, g in goals.items()} == {
        "every_fault_recovered": True,
        "fast_recoveries": True,
        "reprotected": True,
        "exact_output": True,
        "no_leaks": True,
        "rss_stable": True,
        "growth_bounded": True,
    }
    assert goals["fast_recoveries"]["detail"].startswith("2 of 2 within their goal")
    assert goals["reprotected"]["detail"] == "2 of 2 re-protected within 90 s"
    assert "1 not injected" in goals["every_fault_recovered"]["detail"]


def test_each_goal_is_missed_on_its_own_evidence():
    samples = [sample(0, {"primary": 1000}), sample(600, {"primary": 1000})]
    samples += [
        sample(t, {"primary": 1200}, rows=100 + (t - 600) ** 2, memory=10 + (t - 600) ** 2 / 1e4)
        for t in (1200, 1800, 2400, 3000, 3600)
    ]
    faults = [
        fault(1, "kill-driver", recovered=False, recovery_s=None),
        fault(2, "redis-restart", recovery_s=12.0),  # resumed, but later than 10 s
        fault(3, "kill-node"),
    ]
    audits = [
        {"at_s": 300.0, "job": "wc", "lost": 0, "duplicates": 0, "cells": 10},
        {"at_s": 600.0, "job": "topn", "lost": 0, "duplicates": 2, "cells": 10},
    ]
    goals = a_report(faults, audits, samples, leaked_keys=["backstop:job-1:hb:x"])["goals"]
    assert {name: g["met"] for name, g in goals.items()} == {
        "every_fault_recovered": False,
        "fast_recoveries": False,
        "reprotected": None,  # nothing here to re-protect
        "exact_output": False,
        "no_leaks": False,
        "rss_stable": False,
        "growth_bounded": False,
    }
    assert "#1 kill-driver" in goals["every_fault_recovered"]["detail"]
    assert "#2 redis-restart: 12.0 s" in goals["every_fault_recovered"]["detail"]
    assert "primary 1000 -> 1200 MB (+20%)" in goals["rss_stable"]["detail"]
    assert "#1 kill-driver (no episode): not recovered" in goals["fast_recoveries"]["detail"]
    assert "db_rows" in goals["growth_bounded"]["detail"]


def test_recovery_goals_follow_the_action_and_reprotects_count_promotions_and_standbys():
    faults = [
        fault(1, "kill-driver", recovery_s=6.0, actions=["promote"], reprotect_s=None),
        fault(2, "kill-node", recovery_s=31.0, actions=["restart-stage"]),
        fault(3, "kill-node", recovery_s=12.0, actions=["promote"], reprotect_s=91.0),
        fault(4, "kill-driver", recovery_s=29.0, actions=["restart-stage"]),
        fault(5, "kill-standby", recovered=False, recovery_s=None),
        fault(6, "pause-node", recovery_s=60.0),  # no episode: not bounded by these goals
        # A run recorded before rows kept their actions: read from `how`.
        {**fault(7, "operator-exception", recovery_s=4.0), "how": "1 episode(s), promote, closed"},
    ]
    goals = a_report(faults, [], [sample(0, {"primary": 1})])["goals"]
    fast = goals["fast_recoveries"]
    assert not fast["met"]
    assert fast["detail"].startswith("2 of 4 within their goal")  # #3: a promotion of kill-node
    assert "#1 kill-driver (promote): 6.0 s" in fast["detail"]
    assert "#2 kill-node (restart-stage): 31.0 s" in fast["detail"]
    assert "#4" not in fast["detail"] and "#7" not in fast["detail"]
    again = goals["reprotected"]
    assert not again["met"]
    # #1 never re-protected, #3 too late, #5 no new standby; #7's run did not record it.
    assert again["detail"] == (
        "0 of 3 re-protected within 90 s; not: #1 kill-driver: never, #3 kill-node: 91.0 s, "
        "#5 kill-standby: never"
    )


def test_rss_is_judged_per_process_over_the_last_half_hour():
    samples = []
    for t in range(0, 3601, 300):
        # Three primaries, then two after a fault: the kind's total moves, one process does not.
        # The controller grows by 15% at 20 minutes (outside the last 30), and is back after.
        primaries = 3 if t < 2400 else 2
        one = sample(t, {"primary": primaries * 500, "controller": 345 if t == 1200 else 300})
        one["processes"]["primary"]["processes"] = primaries
        samples.append(one)
    rss = report.rss_summary(samples, 3600)
    assert rss["per_process_at_10_min"] == {"primary": 500, "controller": 300}
    assert rss["window_from_s"] == 1800
    assert rss["at_10_min"]["primary"] == 1500 and rss["at_end"]["primary"] == 1000
    assert report.judge_goals(a_report([], [], samples))["rss_stable"]["met"]
    # 11% more in one sample of the last half hour is a miss.
    samples[-3]["processes"]["controller"]["rss_mb"] = 333
    goals = a_report([], [], samples)["goals"]
    assert not goals["rss_stable"]["met"]
    assert "controller 300 -> 333 MB (+11%)" in goals["rss_stable"]["detail"]


def test_each_process_is_judged_against_itself_once_settled_in_its_role():
    def rows_at(t):
        rows = [[100, "primary", 400.0 if t < 3600 else 420.0, 300.0, t + 30]]  # +5% at the end
        if t <= 2700:
            rows.append([200, "standby", 350.0, 280.0, t + 30])
        else:  # killed by the schedule; its replacement settles only in the last sample
            rows.append([201, "standby", {3000: 100.0, 3300: 300.0}.get(t, 340.0), 1.0, t - 2940])
        # A standby promoted at 30 minutes: a primary from then on, settled 10 minutes later.
        if t < 1800:
            rows.append([300, "standby", 350.0, 280.0, t + 30])
        else:
            rows.append([300, "primary", 425.0 if t >= 2400 else 380.0, 300.0, t + 30])
        # A PostgreSQL backend; the database restarted at 25 minutes and the pid came again.
        if t < 1500:
            rows.append([400, "postgres", 20.0, 3.0, t + 30])
        else:
            rows.append([400, "postgres", 23.0 if t == 3600 else 20.0, 3.0, t - 1450])
        # A short-lived process, and its pid used again much later by one that then grows from
        # its start (it never settles: not judged, though it was last seen younger).
        if t == 300:
            rows.append([500, "postgres", 20.0, 3.0, 20])
        if t >= 3300:
            rows.append([500, "postgres", 14.0 if t == 3300 else 30.0, 3.0, t - 3100])
        # A memory read that failed (a process ending as it was sampled) is not a change.
        rows.append([600, "controller", 0.0 if t == 3000 else 230.0, 160.0, t + 30])
        return rows

    samples = []
    for t in range(0, 3601, 300):
        one = sample(t, {"primary": 800, "standby": 350, "postgres": 20})
        one["process_rows"] = rows_at(t)
        samples.append(one)
    drift = report.rss_summary(samples, 3600)["process_drift"]
    # pid 100 and pid 300 as a primary; standby 200 until it was killed, 201 never settled
    # with a later sample; the backend's second life (pid 400 again) settled at 2700 s.
    assert drift["primary"] == {"processes": 2, "pid": 100, "from_mb": 400.0, "to_mb": 420.0,
                                "change": 0.05}  # fmt: skip
    assert (drift["standby"]["processes"], drift["standby"]["pid"]) == (1, 200)
    assert drift["postgres"]["processes"] == 1 and drift["postgres"]["change"] == 0.15
    assert drift["controller"] == {"processes": 1, "pid": 600, "from_mb": 230.0, "to_mb": 230.0,
                                   "change": 0.0}  # fmt: skip
    goals = a_report([], [], samples)["goals"]
    assert not goals["rss_stable"]["met"]
    assert goals["rss_stable"]["detail"].endswith(
        "judged: 5 process(es) of 4 kind(s); not (farthest): postgres (pid 400) 20 -> 23 MB (+15%)"
    )
    backend = next(r for r in samples[-1]["process_rows"] if r[0] == 400)
    backend[2] = 21.0
    assert a_report([], [], samples)["goals"]["rss_stable"]["met"]
    # A run with processes recorded but none settled yet is not judged (not judged per kind).
    short = [{**one, "process_rows": rows_at(one["at_s"])[:1]} for one in samples[:2]]
    short[1]["processes"]["primary"]["rss_mb"] = 1600
    rss = report.rss_summary(short, 300)
    assert rss["process_drift"] == {}
    assert report.judge_rss(rss)["met"] is None
    assert process_rows(
        [ProcRow(7, 1, ("x",), rss_mb=10.04, private_mb=5.0, age_s=99.6, shmem_mb=1.26),
         ProcRow(8, 1, ("y",)), ProcRow(9, 1, ("z",), rss_mb=3.0, shmem_mb=None)],
        {7: "agent", 9: "postgres"},
    ) == [[7, "agent", 10.0, 5.0, 100, 1.3], [9, "postgres", 3.0, 0.0, 0, None]]  # fmt: skip


def test_the_goal_leaves_out_the_shared_memory_a_process_touched():
    # PostgreSQL's checkpointer touches more of the shared buffers at each checkpoint: its RSS
    # rises by shared memory alone (the segment keeps its size). A controller that grows its
    # own memory is still caught, and plain RSS is reported beside the goal's measure.
    samples = []
    for t in range(0, 3601, 300):
        one = sample(t, {"postgres": 20, "controller": 230})
        shmem = 5.0 + t / 300  # 5 MB at the start, 17 MB at the end
        one["process_rows"] = [
            [400, "postgres", 10.0 + shmem, 2.4, t + 30, shmem],
            [600, "controller", 230.0 if t < 3600 else 260.0, 160.0, t + 30, 0.0],
        ]
        samples.append(one)
    rss = report.rss_summary(samples, 3600)
    assert rss["process_drift_measure"] == "rss_less_shmem"
    assert rss["process_drift"]["postgres"]["change"] == 0.0
    # Plain RSS: 17 MB at 10 min (5 + 2 shared), 27 at the end.
    assert rss["process_drift_rss"]["postgres"] == {
        "processes": 1, "pid": 400, "from_mb": 17.0, "to_mb": 27.0, "change": round(10 / 17, 4)
    }  # fmt: skip
    goal = report.judge_rss(rss)
    assert goal["met"] is False
    assert goal["detail"].startswith("each process's RSS less shared memory within 10%")
    assert goal["detail"].endswith("controller (pid 600) 230 -> 260 MB (+13%)")
    for one in samples:
        one["process_rows"][1][2] = 230.0
    assert report.judge_rss(report.rss_summary(samples, 3600))["met"] is True
    # A shared memory read that failed (the process was ending) skips the sample: its whole
    # RSS is not a change. Nor is a row with nothing but shared memory.
    samples[-1]["process_rows"][0][5] = None
    samples[-2]["process_rows"][0][2] = samples[-2]["process_rows"][0][5]
    assert report.judge_rss(report.rss_summary(samples, 3600))["met"] is True
    # Rows recorded before the shared-memory column: the goal judges plain RSS.
    for one in samples:
        one["process_rows"] = [row[:5] for row in one["process_rows"]]
    old = report.rss_summary(samples, 3600)
    assert old["process_drift_measure"] == "rss"
    assert report.judge_rss(old)["met"] is False


def test_private_memory_is_reported_beside_rss_and_not_judged():
    # A PostgreSQL backend's RSS grows with the shared buffers it touches; its private memory
    # does not. An older soak.json has no private memory: none is reported.
    samples = []
    for t in range(0, 3601, 300):
        one = sample(t, {"postgres": 16 if t <= 600 else 23})
        one["processes"]["postgres"]["private_mb"] = 5.0
        samples.append(one)
    rss = report.rss_summary(samples, 3600)
    assert rss["private_per_process_at_10_min"] == {"postgres": 5.0}
    assert rss["private_per_process_farthest"] == {"postgres": 5.0}
    goals = report.judge_goals(a_report([], [], samples))
    assert "postgres 16 -> 23 MB" in goals["rss_stable"]["detail"]  # judged on RSS
    header = {"command": "soak", "date": "2026-11-30", "machine": "2 cores", "spacing_s": [60, 120],
              "rate": 20, "services": {"note": "PG."}}  # fmt: skip
    text = report.to_markdown({**a_report([], [], samples), **header})
    assert "| postgres | 16 | 23 | 16.0 | 23.0 | 5.0 | 5.0 |" in text
    older = [sample(t, {"postgres": 16}) for t in range(0, 3601, 300)]
    assert report.rss_summary(older, 3600)["private_per_process_at_10_min"] == {}


def test_rss_reference_is_at_ten_minutes_or_the_first_fifth_of_a_short_run():
    assert report.reference_at_s(3600) == 600
    assert report.reference_at_s(360) == 72
    samples = [sample(t, {"primary": 100 + t}) for t in (0, 60, 120, 180, 240, 300, 360)]
    rss = report.rss_summary(samples, 360)
    assert rss["reference_at_s"] == 120 and rss["at_10_min"] == {"primary": 220}
    assert rss["at_end"] == {"primary": 460}
    assert "first fifth" in rss["reference"]
    assert report.rss_summary(samples, 3600)["reference"] == "at 10 min"


def test_stopped_job_keys_sorted_into_kept_expiring_and_leaked():
    job = "job-abc"
    keys = [
        (f"backstop:{job}:in", -1),
        (f"backstop:{job}:results", -1),
        (f"backstop:{job}:results:ver", -1),
        (f"backstop:{job}:fence:count", -1),
        (f"backstop:{job}:progress", -1),
        (f"backstop:{job}:progress:ingest-cursor", -1),
        (f"backstop:{job}:controller-cycle", 3500),
        (f"backstop:{job}:events", -1),
    ]
    out = report.sort_job_keys(keys, job)
    # The ingest cursor is kept with its progress stream, and leaked once the stream is gone.
    assert len(out["kept"]) == 6
    assert out["expiring"] == [f"backstop:{job}:controller-cycle"]
    assert out["leaked"] == [f"backstop:{job}:events"]
    without_stream = [k for k in keys if k[0] != f"backstop:{job}:progress"]
    assert report.sort_job_keys(without_stream, job)["leaked"] == [
        f"backstop:{job}:events",
        f"backstop:{job}:progress:ingest-cursor",
    ]


def test_report_has_the_keys_the_issue_asks_for_and_is_json():
    samples = [sample(t, {"controller": 300}) for t in (0, 60, 120, 180, 240, 300, 360)]
    faults = [fault(1, "kill-standby"), fault(2, "agent-restart")]
    audits = [{"at_s": 360.0, "job": "wc", "lost": 0, "duplicates": 0, "cells": 10}]
    built = a_report(faults, audits, samples, duration_s=360)
    assert set(report.REPORT_KEYS) <= set(built)
    assert set(built["rss_mb"]) >= {"at_10_min", "at_end", "reference"}
    hour = built["per_hour"]["hours"][0]
    assert hour["faults"] == {
        "agent-restart": {"events": 1, "recovered": 1},
        "kill-standby": {"events": 1, "recovered": 1},
    }
    assert hour["audits_worst"] == {"wc": {"lost": 0, "duplicates": 0}}
    assert hour["db_rows"] == 103 and hour["db_rows_by_table"]["console_metricsample"] == 100
    assert {"rss_mb", "fds", "redis_used_memory_mb", "redis_keys", "checkpoint_mb"} <= set(hour)
    assert json.loads(json.dumps(built)) == built
    text = report.to_markdown({
        **built, "command": "python manage.py soak --minutes 6", "date": "2026-11-27",
        "machine": "2 cores", "spacing_s": [40, 60], "rate": 20, "services": {"note": "PG."},
    })  # fmt: skip
    assert "| 1 | 100 s | kill-standby | x | yes | 2.0 |" in text
    assert "| every_fault_recovered | yes |" in text


def test_a_runs_policy_is_parsed_and_set_through_an_admins_checks(db):
    assert parse_policy(["light_input_wait_s=2", " hold_host_reserve = true"]) == (
        ("light_input_wait_s", "2"),
        ("hold_host_reserve", "true"),
    )
    with pytest.raises(ValueError, match="--policy: FIELD=VALUE"):
        parse_policy(["light_input_wait_s"])
    before = Policy.current().version
    assert set_run_policy((("light_input_wait_s", "2"),)) == {"light_input_wait_s": 2.0}
    policy = Policy.current()
    assert (policy.version, policy.light_input_wait_s) == (before + 1, 2.0)
    assert policy.reason == "set by the run's --policy"
    # Refused as an admin's change would be, naming the field; nothing written.
    with pytest.raises(RuntimeError, match="light_input_wait_s"):
        set_run_policy((("light_input_wait_s", "99"),))
    with pytest.raises(RuntimeError, match="no_such_field"):
        set_run_policy((("no_such_field", "1"),))
    assert Policy.current().version == before + 1
