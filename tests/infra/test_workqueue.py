"""The controller's delaying work queue, on a clock the test moves (no sleeping, no Redis)."""

from __future__ import annotations

import threading

from infra.workqueue import FailureBackoff, WorkQueue, failure_delay_s


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_keys_come_out_when_due_earliest_first():
    clock = Clock()
    queue = WorkQueue(clock)
    queue.add("b", 2.0)
    queue.add("a", 1.0)
    queue.add("now")
    assert queue.get(timeout_s=0) == "now"
    assert queue.get(timeout_s=0) is None  # a and b are not due yet
    clock.now += 1.5
    assert queue.get(timeout_s=0) == "a"
    clock.now += 1.0
    assert queue.get(timeout_s=0) == "b"


def test_an_urgent_key_goes_before_a_backlog_of_due_keys():
    clock = Clock()
    queue = WorkQueue(clock)
    for i in range(5):
        queue.add(f"periodic-{i}", 0.1 * i)
    clock.now += 10.0  # a busy controller is behind on all of them
    queue.add("failed", urgent=True)
    assert queue.get(timeout_s=0) == "failed"
    assert queue.get(timeout_s=0) == "periodic-0"


def test_a_key_is_queued_once_and_an_earlier_request_wins():
    clock = Clock()
    queue = WorkQueue(clock)
    queue.add("job", 5.0)
    queue.add("job", 10.0)  # later: ignored
    queue.add("job", 1.0)  # earlier: wins
    assert len(queue) == 1
    clock.now += 1.0
    assert queue.get(timeout_s=0) == "job"
    assert queue.get(timeout_s=0) is None  # the superseded entries are not handed out again


def test_a_key_being_processed_is_not_handed_out_twice_and_a_wake_up_meanwhile_is_kept():
    clock = Clock()
    queue = WorkQueue(clock)
    queue.add("job")
    assert queue.get(timeout_s=0) == "job"
    queue.add("job")  # an agent's report arrives while a worker reconciles the job
    assert queue.get(timeout_s=0) is None  # not to a second worker
    queue.done("job", requeue_in_s=1.0)  # the report is sooner than the period
    assert queue.get(timeout_s=0) == "job"


def test_done_requeues_after_the_period_or_not_at_all():
    clock = Clock()
    queue = WorkQueue(clock)
    queue.add("settled")
    queue.add("ended")
    first, second = queue.get(timeout_s=0), queue.get(timeout_s=0)
    assert {first, second} == {"settled", "ended"}
    queue.done("settled", requeue_in_s=1.0)
    queue.done("ended", None)
    clock.now += 0.5
    assert queue.get(timeout_s=0) is None
    clock.now += 0.5
    assert queue.get(timeout_s=0) == "settled"
    assert len(queue) == 0


def test_a_forgotten_key_is_not_requeued_even_by_its_running_worker():
    clock = Clock()
    queue = WorkQueue(clock)
    queue.add("job")
    assert queue.get(timeout_s=0) == "job"
    queue.forget("job")  # its lease was lost meanwhile
    queue.done("job", requeue_in_s=0.0)
    assert queue.get(timeout_s=0) is None
    queue.add("job")  # taken again later
    assert queue.get(timeout_s=0) == "job"


def test_get_blocks_until_a_key_is_added_and_shut_down_wakes_every_waiter():
    queue = WorkQueue()
    got = []
    waiters = [threading.Thread(target=lambda: got.append(queue.get())) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    queue.add("job")
    for _ in range(500):  # one waiter takes the job (at most 5 s)
        if got:
            break
        threading.Event().wait(0.01)
    assert got == ["job"]
    queue.shut_down()
    for waiter in waiters:
        waiter.join(5)
    assert not any(waiter.is_alive() for waiter in waiters)
    assert sorted(got, key=str) == sorted(["job", None, None], key=str)


def test_a_failing_key_backs_off_exponentially_up_to_the_cap_and_a_success_resets_it():
    backoff = FailureBackoff(base_s=1.0, cap_s=60.0)
    delays = [backoff.failed("bad") for _ in range(9)]
    # 1 s doubling per failure in a row: 1, 2, 4, ... 64 s, capped at 60 s.
    assert delays == [
        (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 16.0), (6, 32.0), (7, 60.0), (8, 60.0),
        (9, 60.0),
    ]  # fmt: skip
    assert backoff.failures("good") == 0 and backoff.failing() == 1
    assert backoff.succeeded("bad") == 9
    assert backoff.failures("bad") == 0 and backoff.failing() == 0
    assert backoff.failed("bad") == (1, 1.0)  # a new streak starts from the base again


def test_the_failure_delay_is_bounded_however_long_a_key_fails():
    assert failure_delay_s(0) == 0.0
    assert failure_delay_s(1, base_s=0.5, cap_s=10.0) == 0.5
    assert failure_delay_s(4, base_s=0.5, cap_s=10.0) == 4.0
    assert failure_delay_s(10_000, base_s=0.5, cap_s=10.0) == 10.0
