"""What the controller decides about a live job whose supervision state is gone from Redis
(console/policy/redis_loss.py)."""

from console.policy.redis_loss import Remains, judge


def test_a_redis_that_came_back_empty_lost_the_jobs_data():
    verdict = judge(Remains({"split": None, "count": None}, False, False, {"count": False}))
    assert verdict.data_lost
    assert verdict.gone == (
        "supervision state", "input stream", "results", "fencing epochs", "sink watermarks"
    )  # fmt: skip
    assert verdict.reason == (
        "Redis lost its data (supervision state, input stream, results, fencing epochs and "
        "sink watermarks gone); the job cannot continue exactly-once: its stages are fenced "
        "off, create it again as a new job"
    )


def test_input_written_again_does_not_hide_lost_fencing_epochs():
    # The generator may have written entries again before the controller looked.
    verdict = judge(Remains({"count": None}, True, False, {"count": False}))
    assert verdict.data_lost
    assert "fencing epochs" in verdict.gone and "input stream" not in verdict.gone


def test_a_lost_input_stream_alone_is_data_lost():
    verdict = judge(Remains({"count": "3"}, False, True, {"count": True}))
    assert verdict.data_lost and verdict.gone == ("supervision state", "input stream")


def test_only_the_supervision_state_gone_leaves_the_job_restartable():
    verdict = judge(Remains({"count": "3"}, True, True, {"count": True}))
    assert not verdict.data_lost
    assert verdict.reason == "supervision state lost: relaunch the job"
