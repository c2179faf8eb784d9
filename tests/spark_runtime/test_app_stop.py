"""An app's stop, queries first (Supervisor.ask_app_to_stop), driven with synthetic events and
clock values (no processes, no Redis): the stop is asked once, waited for up to
APP_STOP_WITHIN_S, then whatever still runs is killed; Backstop's own jobs are killed at once."""

from __future__ import annotations

from spark_runtime import upgrade as upgrades
from spark_runtime.replicas import HeartbeatSeen, KillReplica
from spark_runtime.supervision import Supervisor
from spark_runtime.upgrade import StopApp

NODES = ["node-1", "node-2"]


def running(app: bool) -> Supervisor:
    """A one-stage job under restart-all whose primary job-1 is running."""
    sup = Supervisor("j", "windows@1", {"job": ("app",)}, "restart-all", NODES, app=app)
    sup.start(0.0)
    sup.handle(HeartbeatSeen("job-1", 1.0, {"role": "primary", "state": "running", "batches": 3}))
    return sup


def test_a_stopping_app_is_asked_once_then_taken_down_when_its_process_has_exited():
    sup = running(app=True)
    assert sup.ask_app_to_stop(10.0, alive=lambda _: True) == [
        StopApp("job-1", 10.0, why="the job's stop")
    ]
    # Still running: wait, and do not ask again.
    assert sup.ask_app_to_stop(11.0, alive=lambda _: True) == []
    assert sup.ask_app_to_stop(10.0 + upgrades.APP_STOP_WITHIN_S - 1, alive=lambda _: True) == []
    # Its process exited after its queries stopped: nothing more to wait for.
    assert sup.ask_app_to_stop(25.0, alive=lambda _: False) is None
    assert sup.stop() == [KillReplica("job-1")]  # the caller's idempotent kill
    assert [text for _, text in sup.history][-1] == "stop: job-1 asked to stop its queries"


def test_an_app_that_does_not_stop_within_the_bound_is_killed_and_the_history_says_so():
    sup = running(app=True)
    sup.ask_app_to_stop(10.0, alive=lambda _: True)
    assert sup.ask_app_to_stop(10.0 + upgrades.APP_STOP_WITHIN_S, alive=lambda _: True) is None
    assert sup.history[-1][1] == (
        f"stop: job-1 still ran {upgrades.APP_STOP_WITHIN_S:g} s after it was asked to stop: killed"
    )


def test_the_ask_survives_a_new_controller_which_waits_instead_of_asking_again():
    sup = running(app=True)
    sup.ask_app_to_stop(10.0, alive=lambda _: True)
    successor = Supervisor.from_dict(sup.to_dict())
    assert successor.stop_asked_at == 10.0
    assert successor.ask_app_to_stop(12.0, alive=lambda _: True) == []


def test_backstops_own_jobs_and_an_app_not_yet_running_are_not_asked():
    assert running(app=False).ask_app_to_stop(10.0, alive=lambda _: True) is None
    starting = Supervisor("j", "windows@1", {"job": ("app",)}, "restart-all", NODES, app=True)
    starting.start(0.0)  # no heartbeat yet: no query to stop, its kill loses nothing
    assert starting.ask_app_to_stop(10.0, alive=lambda _: True) is None
    assert starting.stop_asked_at is None
