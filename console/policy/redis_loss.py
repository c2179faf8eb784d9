"""What a live job whose supervision state is gone from Redis still has there, and what the
controller decides about it (docs/RELIABILITY.md, "Redis without its data").

The supervision state of a job is saved before the job turns live and deleted only when it
stops, so a live job without it means Redis lost the key: a Redis started again without
persistence, a FLUSHALL, an evicting `maxmemory-policy`. What else went with it decides
whether the job can go on exactly-once:

- the fencing epochs (`backstop:{job}:fence:{stage}`): every writer of a running job has taken
  one, and nothing but a controller's start or promotion creates one. Gone, the next writer to
  take an epoch would count from 1 again, the number an old, still running writer may hold;
- the input stream: the stages' checkpoints hold offsets into it (entry ids); gone, what the
  generator writes again gets new ids and would be counted a second time from any checkpoint.

Either one gone: Redis lost the job's data, and its results (kept in Redis too) are gone with
it. The controller fences every stage off for good (the epoch is set to `FENCE_LOST`, which
no writer holds and none can increment), stops the job's processes and fails the job with the
reason. Only the supervision state gone (the data intact): the job is failed as before, its
processes stopped, and an operator's restart resumes from its checkpoints under new epochs.

Pure Python, no Django.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Remains:
    """What Redis still holds of a job: `fences` (stage -> its epoch, None when missing; every
    stage the job ran), whether its input stream, results (hash or output stream) and each
    stage's sink watermarks exist."""

    fences: dict[str, str | None]
    input_stream: bool
    results: bool
    watermarks: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """`data_lost`: the job cannot go on exactly-once (fence it off and fail it); `gone`: what
    is missing, for the reason; `reason`: the job's one-line status reason."""

    data_lost: bool
    gone: tuple[str, ...]
    reason: str


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def judge(remains: Remains) -> Verdict:
    """The decision about a live job whose supervision state is gone."""
    gone = ["supervision state"]
    if not remains.input_stream:
        gone.append("input stream")
    if not remains.results:
        gone.append("results")
    if any(epoch is None for epoch in remains.fences.values()):
        gone.append("fencing epochs")
    if remains.watermarks and not any(remains.watermarks.values()):
        gone.append("sink watermarks")
    data_lost = not remains.input_stream or "fencing epochs" in gone
    if data_lost:
        reason = (
            f"Redis lost its data ({_listed(gone)} gone); the job cannot continue "
            "exactly-once: its stages are fenced off, create it again as a new job"
        )
    else:
        reason = "supervision state lost: relaunch the job"
    return Verdict(data_lost, tuple(gone), reason)
