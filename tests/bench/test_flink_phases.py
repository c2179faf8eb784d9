"""Where the Flink peer's gap goes (bench/flink_peer/phases.py): pure, on lines of a real
JobManager log (topn, a TaskManager killed; 2026-11-27), shortened."""

from datetime import datetime

from bench.flink_peer.phases import fault_phases, state_changes

EG = "INFO  org.apache.flink.runtime.executiongraph.ExecutionGraph       [] - "
JOB = "Job backstop-peer-topn (f241f408c570e4d56045c908f71a803d) switched from state"
TOPN = "topn (1/1) (45f6_1a93_0_1) switched from"
COUNT = "window_count, _stream_key_by_map_operator (1/1) (45f6_9dd6_0_1) switched from"
OLD_COUNT = "window_count, _stream_key_by_map_operator (1/1) (45f6_9dd6_0_0) switched from"
APP = (
    "INFO  org.apache.flink.runtime.application.AbstractApplication     [] - "
    "Application SingleJobApplication(backstop-peer-topn) (f241) switched from state"
)
FAILED = "topn (1/1) (45f6_1a93_0_0) switched from RUNNING to FAILED on tm-2 @ localhost"
LOG = f"""2026-11-27 21:37:17,550 {APP} CREATED to RUNNING.
2026-11-27 21:39:05,593 {EG}{FAILED} (dataPort=46285).
2026-11-27 21:39:05,747 {EG}{JOB} RUNNING to RESTARTING.
2026-11-27 21:39:05,816 {EG}{OLD_COUNT} CANCELING to CANCELED.
2026-11-27 21:39:06,390 {EG}{JOB} RESTARTING to RUNNING.
2026-11-27 21:39:06,518 {EG}{TOPN} CREATED to SCHEDULED.
2026-11-27 21:39:06,563 {EG}{TOPN} SCHEDULED to DEPLOYING.
2026-11-27 21:39:08,554 {EG}{COUNT} DEPLOYING to INITIALIZING.
2026-11-27 21:39:08,556 {EG}{TOPN} DEPLOYING to INITIALIZING.
a line that Flink wrapped, without a timestamp
2026-11-27 21:39:26,233 {EG}{COUNT} INITIALIZING to RUNNING.
2026-11-27 21:39:27,146 {EG}{TOPN} INITIALIZING to RUNNING.
2026-11-27 21:39:34,993 {EG}{JOB} RUNNING to RESTARTING.
2026-11-27 21:39:35,500 {EG}{JOB} RESTARTING to RUNNING.
"""


def at(clock: str) -> float:
    return datetime.strptime(f"2026-11-27 {clock}", "%Y-%m-%d %H:%M:%S.%f").timestamp()


def test_each_faults_gap_splits_into_flinks_own_steps():
    changes = state_changes(LOG.splitlines())
    # The application's state change is not the job's; the wrapped line is skipped.
    assert [c[1:] for c in changes[:2]] == [("job", "RUNNING", "RESTARTING"),
                                            ("task", "CANCELING", "CANCELED")]  # fmt: skip
    outputs = [at("21:38:50.000"), at("21:39:27.900"), at("21:39:28.400")]
    first, second = fault_phases(changes, [at("21:39:04.000"), at("21:39:34.500")], outputs)
    # 05.747 - 04.000; 06.390 - 05.747; the last task deployed at 08.556; the last one running
    # at 27.146; the next output at 27.900.
    assert first == {
        "detection_s": 1.75, "restart_delay_s": 0.64, "deployment_s": 2.17,
        "initialization_s": 18.59, "first_output_s": 0.75,
    }  # fmt: skip
    # The second fault's tasks never ran before the log ends: no step past the restart.
    assert second == {
        "detection_s": 0.49, "restart_delay_s": 0.51, "deployment_s": None,
        "initialization_s": None, "first_output_s": None,
    }  # fmt: skip


def test_a_step_after_the_next_fault_is_not_this_faults():
    changes = state_changes(LOG.splitlines())
    # A second fault at 20 s: the tasks of the first restart ran after it.
    first, _ = fault_phases(changes, [at("21:39:04.000"), at("21:39:20.000")], [])
    assert first["deployment_s"] == 2.17 and first["initialization_s"] is None
