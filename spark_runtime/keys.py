"""Every Redis key the data plane reads or writes, in one place.

All keys of a job share the prefix `backstop:{job}:`, so a job can be inspected with
`redis-cli --scan --pattern 'backstop:JOB:*'` and removed with `delete_job_keys`.
"""

from __future__ import annotations

PREFIX = "backstop"


def make_key(*parts: object) -> str:
    """A Backstop key: PREFIX and `parts` joined by colons (`make_key(job, "in")` is
    `backstop:{job}:in`). Every key of the data plane and the control plane (infra.keys) is
    built here, so the prefix is written once."""
    return ":".join((PREFIX, *(str(part) for part in parts)))


def job_prefix(job: str) -> str:
    """The prefix shared by all keys of `job`."""
    return make_key(job, "")


def input_stream(job: str) -> str:
    """The job's input stream (entries carry `id`, `ts` and the topology's payload fields)."""
    return make_key(job, "in")


def channel_stream(job: str, stage: str) -> str:
    """The intermediate stream written by `stage` and read by the stage after it."""
    return make_key(job, "s", stage)


def results(job: str) -> str:
    """The hash of final results (wordcount: word -> count; see docs/DATA_PLANE.md)."""
    return make_key(job, "results")


def result_versions(job: str) -> str:
    """Hash field -> version (input offset) of the value in `results`; makes upserts idempotent."""
    return make_key(job, "results", "ver")


def output_stream(job: str) -> str:
    """The stream of emitted records of topologies that emit records (shuffle)."""
    return make_key(job, "out")


def written_keys(job: str, sink: str) -> str:
    """The set of record keys a user job has appended to `sink` (each key is written once)."""
    return make_key(job, "written", sink)


def dead_letters(job: str) -> str:
    """The dead-letter stream: malformed input entries with the stage and the reason."""
    return make_key(job, "dead")


def dead_seen(job: str) -> str:
    """Hash `{stage}|{entry id}` -> 1, so a replayed batch does not dead-letter an entry twice."""
    return make_key(job, "dead", "seen")


def stats(job: str) -> str:
    """Hash of counters (e.g. `dead:{stage}`: malformed entries seen by a stage)."""
    return make_key(job, "stats")


def external_io(job: str) -> str:
    """JSON of the job's Kafka source and sink, if any (spark_runtime/external_io.py); absent:
    the job reads `input_stream` and writes its Redis results only."""
    return make_key(job, "io")


def app_args(job: str) -> str:
    """JSON list of an app job's arguments, its `sys.argv[1:]` (spark_runtime/app_stage.py),
    written at launch before any replica starts; absent: no arguments."""
    return make_key(job, "app", "args")


def app_operators(job: str) -> str:
    """Hash query name -> JSON list of the stateful operators an app job's stage found in that
    query's physical plan (spark_runtime/app_plan.py); the controller makes them the job's
    operators (console/services/app_operators.py)."""
    return make_key(job, "app", "operators")


def app_output(job: str) -> str:
    """List of an app job's newest output lines (its stdout and stderr), newest first, capped
    at APP_OUTPUT_LINES (spark_runtime/app_output.py)."""
    return make_key(job, "app", "output")


def kafka_plans(job: str) -> str:
    """The plan log of the job's Kafka input: a list of JSON end-offset vectors shared by every
    replica that reads it (spark_runtime/kafka_plan.py)."""
    return make_key(job, "kafka", "plans")


def kafka_lag(job: str) -> str:
    """Hash replica id -> JSON {stage, topic, at, partitions: {p: [read, end]}}: how far each
    replica reading the job's Kafka input is behind the topic's end (spark_runtime.kafka_source)."""
    return make_key(job, "kafka", "lag")


def fence(job: str, stage: str) -> str:
    """The fencing epoch of `stage`: incremented by every replica that becomes its primary."""
    return make_key(job, "fence", stage)


def watermarks(job: str, stage: str) -> str:
    """Hash sink name -> highest output version `stage` has written to that sink."""
    return make_key(job, "wm", stage)


def replicas(job: str) -> str:
    """Hash replica id -> JSON (stage, role, pid, node, state, ...), kept current by each stage."""
    return make_key(job, "replicas")


def heartbeat(job: str, replica: str) -> str:
    """Heartbeat of a replica: a key with a short TTL, refreshed while the process lives."""
    return make_key(job, "hb", replica)


def batch_pace(job: str, replica: str) -> str:
    """Seconds between the batches of `replica` that read new input, while it is a caught-up
    low-priority standby (spark_runtime.stage sets it with a short TTL and renews it); absent,
    its queries read new input on every trigger (spark_runtime.redis_source)."""
    return make_key(job, "pace", replica)


def control(job: str, replica: str) -> str:
    """List of JSON control commands for a replica (promote, stop, trigger, fault)."""
    return make_key(job, "control", replica)


def controller_lease(job: str) -> str:
    """The lease of the controller process that supervises a job: its token
    (spark_runtime.command_fence, infra/leases.py), expiring soon after that process dies; read by
    every receiver of the controller's commands."""
    return make_key(job, "controller-lease")


def controller_tenure(job: str) -> str:
    """How many times a controller took the job's lease: each taking increments it, and its
    number is in the taker's token. Never deleted, so a tenure number is never given twice."""
    return make_key(job, "controller-tenure")


def commands_in_progress(job: str) -> str:
    """Set of the controller commands of a job that receivers are carrying out now, each marked
    in the step that checked its lease (spark_runtime.command_fence.carrying_out); while it is
    not empty the job's lease does not change hands. Expires on its own."""
    return make_key(job, "commands-in-progress")


def refused_commands() -> str:
    """Capped stream of the controller commands receivers refused (spark_runtime.command_fence):
    job, receiver, command, token, lease, reason."""
    return make_key("refused-commands")


def progress(job: str) -> str:
    """Stream of query progress records of all replicas of the job (capped)."""
    return make_key(job, "progress")


def flink_task_fault(job: str) -> str:
    """The Flink peer benchmark's task-failure flag (bench/flink_peer/job.py): the writing subtask
    that takes it (GETDEL) raises."""
    return make_key(job, "flink", "task-fault")


def events(job: str) -> str:
    """Stream of supervision events and actions (failures, restarts, promotions), capped."""
    return make_key(job, "events")


def spares(node: str) -> str:
    """Hash spare id -> JSON {pid, state (`starting`, `idle`), since} of a node's warm spares:
    pre-started stage processes (JVM and SparkSession up, no query) waiting for a replica."""
    return make_key("node", node, "spares")


def spare_control(node: str, spare: str) -> str:
    """List of JSON commands for a warm spare: `{"cmd": "become", "args": [stage CLI args]}`."""
    return make_key("node", node, "spare", spare)


def spare_warmup_stream(node: str, spare: str) -> str:
    """A few entries a warm spare reads once through the `redis_stream` source while warming up
    (deleted right after)."""
    return make_key("node", node, "spare", spare, "warmup")


def class_sharing_warmup_stream(pid: int) -> str:
    """The entries the class-data archive's builder (process `pid`) reads once while it records
    the classes a stage loads (spark_runtime/class_sharing.py; deleted right after)."""
    return make_key("cds-warmup", pid)


def spare_warmup_lock(host: str) -> str:
    """The spare warming up on `host` (one at a time per machine; value: its spare id)."""
    return make_key("host", host, "spare-warming")


def spares_wanted(node: str) -> str:
    """How many warm spares the policy wants on a node (set by the controller every cycle)."""
    return make_key("node", node, "spares", "wanted")


def spare_asked(node: str) -> str:
    """How many spares the controller last asked a node for, set for a few seconds when it
    raised the node's target above the spares the node holds (console.services.control.act):
    another job's cycle meanwhile counts them as held, so the host's next spare is not asked
    for on two nodes before the first agent has started it."""
    return make_key("node", node, "spares", "asked")


def spare_refill_hold() -> str:
    """Set (with a short expiry) when a warm spare takes over a replica, and renewed every
    policy cycle while any job re-protects a stage: no node starts a new warm spare until it
    expires (spark_runtime.spare.hold_spare_refills), and a spare still warming up waits at the
    lowest CPU priority meanwhile (spark_runtime.spare.watch_for_taker)."""
    return make_key("spares", "refill-hold")


def spare_needed() -> str:
    """Set (with a short expiry) while some job lacks an idle warm spare where its next fault
    would start a process (console.policy.spares.spare_needed), renewed every policy cycle: a
    spare warming up takes the normal CPU priority only then, else only the CPU nothing else
    wants (spark_runtime.spare.warming_nice)."""
    return make_key("spares", "needed")


def spare_plans() -> str:
    """Hash: job -> JSON {"plans": [...], "at": epoch s}, the stage plans of each live job whose
    strategy keeps warm spares, renewed every policy cycle; each warm spare runs a few of them
    once (spark_runtime.spare_plans)."""
    return make_key("spares", "plans")


PROGRESS_MAXLEN = 10_000
APP_OUTPUT_LINES = 200
EVENTS_MAXLEN = 10_000
REFUSED_COMMANDS_MAXLEN = 10_000


def delete_job_keys(client, job: str) -> int:
    """Delete every key of `job`; returns how many were removed. Used by tests and benchmarks."""
    removed = 0
    batch = []
    for key in client.scan_iter(match=f"{job_prefix(job)}*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            removed += client.delete(*batch)
            batch = []
    if batch:
        removed += client.delete(*batch)
    return removed
