"""Fenced commands (spark_runtime/command_fence.py): which commands a receiver carries out."""

from spark_runtime.command_fence import (
    RELEASED_PREFIX,
    FenceMemory,
    holder_of,
    judge,
    lease_token,
    tenure_of,
)


def test_a_command_counts_while_the_lease_holds_its_token_or_its_release():
    token = lease_token("host:12:ab", 4)
    assert token == "host:12:ab#4" and tenure_of(token) == 4
    assert judge(token, token).accepted
    # Given up after sending (a stop's kills, then the release): still the sender's.
    assert judge(token, RELEASED_PREFIX + token).accepted


def test_a_command_of_a_lease_taken_over_expired_or_older_is_refused_with_why():
    mine, theirs = lease_token("a", 4), lease_token("b", 5)
    taken = judge(mine, theirs)
    assert not taken.accepted and "b#5" in taken.reason
    expired = judge(mine, None)
    assert not expired.accepted and "expired" in expired.reason
    # Taken over and given up again: the released lease is another tenure's.
    assert not judge(mine, RELEASED_PREFIX + theirs).accepted
    older = judge(mine, mine, newest_seen=5)
    assert not older.accepted and "older" in older.reason


def test_a_command_without_a_token_is_not_a_controllers_and_is_carried_out():
    assert judge(None, None).accepted
    assert judge(None, lease_token("b", 9), newest_seen=9).accepted


def test_a_receiver_remembers_the_newest_tenure_it_obeyed():
    memory = FenceMemory()
    first, second = lease_token("a", 1), lease_token("b", 2)
    assert memory.judge("job", second, second).accepted
    # Even if Redis lost the lease and "a" wrote its old token back, tenure 1 is refused.
    assert not memory.judge("job", first, first).accepted
    assert memory.judge("other-job", first, first).accepted  # per job
    assert memory.newest("job") == 2


def test_the_holder_named_by_a_lease_value():
    assert holder_of(lease_token("host:1:x", 3)) == "host:1:x"
    assert holder_of(RELEASED_PREFIX + lease_token("host:1:x", 3)) is None
    assert holder_of(None) is None


def test_a_stage_refuses_a_stalled_controllers_promotion_and_says_so():
    # The stage's own check (spark_runtime/stage.py `carrying_out_command`) against the real
    # Redis.
    import argparse

    import redis
    from django.conf import settings

    from infra.leases import Leases
    from spark_runtime import keys
    from spark_runtime.stage import carrying_out_command

    def obeyed(client, memory, args, command) -> bool:
        with carrying_out_command(client, memory, args, command) as accepted:
            return accepted

    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    job = "jk-stage-fence"
    ours = [keys.controller_lease(job), keys.controller_tenure(job), keys.refused_commands()]
    client.delete(*ours)
    try:
        stalled = Leases(client, "ctl-stalled", ttl_s=30).try_acquire(job)
        client.delete(keys.controller_lease(job))  # its lease expired
        successor = Leases(client, "ctl-successor", ttl_s=30).try_acquire(job)
        args = argparse.Namespace(job=job, replica_id="wc-2")
        memory = FenceMemory()
        assert not obeyed(client, memory, args, {"cmd": "promote", "lease": stalled})
        assert obeyed(client, memory, args, {"cmd": "promote", "lease": successor})
        assert obeyed(client, memory, args, {"cmd": "fault", "kind": "slow_batches"})
        [(_, refusal)] = client.xrange(keys.refused_commands())
        assert (refusal["receiver"], refusal["command"], refusal["token"]) == (
            "stage wc-2",
            "promote",
            stalled,
        )
    finally:
        client.delete(*ours)


def test_a_receiver_holds_the_lease_still_while_it_carries_a_command_out(settings):
    # The lease was given up by its holder after sending (a stop's kills): free for another
    # controller, but not while a receiver is carrying out one of those kills.
    import redis

    from infra.leases import Leases
    from spark_runtime import keys
    from spark_runtime.command_fence import CARRYING_OUT_MS, carrying_out

    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    job = "jk-carrying-out"
    marks = keys.commands_in_progress(job)
    ours = [keys.controller_lease(job), keys.controller_tenure(job), marks]
    client.delete(*ours)
    try:
        holder = Leases(client, "ctl-holder", ttl_s=30)
        token = holder.try_acquire(job)
        holder.release(job)
        successor = Leases(client, "ctl-successor", ttl_s=30)
        with carrying_out(client, FenceMemory(), job, token, "agent n1", "kill c-1") as verdict:
            assert verdict.accepted
            assert successor.try_acquire(job) is None, "the lease changed hands mid-command"
            # A receiver that dies here lets go on its own, soon.
            assert 0 < client.pttl(marks) <= CARRYING_OUT_MS
        assert client.exists(marks) == 0
        successor_token = successor.try_acquire(job)
        assert successor_token is not None and tenure_of(successor_token) > tenure_of(token)
        # A refused command holds nothing back.
        with carrying_out(client, FenceMemory(), job, token, "agent n1", "kill c-1") as verdict:
            assert not verdict.accepted
            assert client.exists(marks) == 0
    finally:
        client.delete(*ours, keys.refused_commands())
