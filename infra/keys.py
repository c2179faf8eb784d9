"""Redis keys of the control plane (node agents, controller). Data-plane keys live in
spark_runtime/keys.py, whose `make_key` (the `backstop:` prefix and the parts, joined by colons)
builds these too."""

# A job's controller lease and tenure are read by the stages too (spark_runtime.command_fence):
# defined with the data plane's keys, named here with the control plane's.
from spark_runtime.keys import commands_in_progress as commands_in_progress
from spark_runtime.keys import controller_lease as controller_lease
from spark_runtime.keys import controller_tenure as controller_tenure
from spark_runtime.keys import make_key

NODE_METRICS_MAXLEN = 3600  # an hour of 1 s samples per node
AGENT_EVENTS_MAXLEN = 10_000
FAULT_MARK_TTL_S = 3600  # longer than any redelivery of a fault task


def node_heartbeat(node: str) -> str:
    """Latest usage sample of a node as JSON, with a short TTL: gone means the agent is silent."""
    return make_key("node", node, "hb")


def node_metrics(node: str) -> str:
    """Capped stream of a node's usage samples (field `sample`, JSON)."""
    return make_key("node", node, "metrics")


# The kinds of entries on the agent events stream.
EVENT_EXIT = "exit"  # a stage process exited (with its log tail)
EVENT_REFUSED = "refused"  # a fault the agent would not or could not carry out (with why)
EVENT_UPGRADE = "upgrade"  # the console asks the job's controller to look at its upgrade
EVENT_SPARK_KILLED = "spark-killed"  # a Spark executor or worker the agent killed for a fault


def agent_events() -> str:
    """Stream of what agents saw happen and did: one entry per event, `kind` one of EVENT_*."""
    return make_key("agent-events")


def reserve_claims() -> str:
    """Hash "job:stage" -> JSON StandbyClaim (console.policy.reserve): every stage the policy
    gives a standby, its priority, cost and whether the host reserve downgraded it, renewed by
    its job's policy cycle; every cycle reads all of them to decide across jobs."""
    return make_key("reserve", "claims")


def controllers() -> str:
    """Sorted set of the live controller processes, scored by when each last said so."""
    return make_key("controllers")


def controller_cycle(job_key: str) -> str:
    """JSON {"at", "duration_s"} of the controller's last policy cycle of a job (for /metrics)."""
    return make_key(job_key, "controller-cycle")


def reconcile_failures(job_key: str) -> str:
    """JSON {"failures": in a row, "since", "at": epoch seconds of the first and the last,
    "error": the last one's exception, "retry_in_s", "controller"} while the job's reconciles
    fail (console.services.fleet); deleted by its next successful one. Read by the job page,
    the API and /metrics."""
    return make_key(job_key, "reconcile-failures")


def controller_stats(owner: str) -> str:
    """Hash of one controller process's work-queue figures (queue depth, reconciles, their
    errors and total duration, failed membership rounds), written every renewal with a short
    TTL (console.services.fleet), summed by /metrics over the live controllers."""
    return make_key("controller", owner, "stats")


def kafka_conditions(job_key: str) -> str:
    """Hash condition (`source`: the Kafka source cannot read; `lag`: the primaries' lag is over
    the policy's bound) -> epoch seconds when the controller first saw it, deleted when it
    clears (console.services.control.record.watch_kafka). Alerts name a condition by that time,
    so one that persists is alerted once and one that comes back is alerted again."""
    return make_key(job_key, "kafka-conditions")


def job_activity(job_key: str) -> str:
    """Hash `input`, `output`, `watched`: epoch seconds of the newest batch that read input, of
    the newest that wrote output, and since when the controller watches them (the output-stalled
    alert, console.services.control.record.watch_conditions); kept in Redis so a controller
    that takes the job over goes on from there."""
    return make_key(job_key, "io-activity")


def job_alerts(job_key: str) -> str:
    """Set of the alert keys the controller raised for the job and has not cleared yet
    (console.services.control.record.watch_conditions clears those whose condition is gone)."""
    return make_key(job_key, "alerts")


def job_strays(job_key: str) -> str:
    """Hash replica id -> its heartbeat time, of the job's replicas that ran without being in
    its supervision state at the last policy cycle (console.services.control.act.kill_strays
    kills those still beating at the next one)."""
    return make_key(job_key, "strays")


def controller_state(job_key: str) -> str:
    """The supervision state of a job as JSON, so a restarted controller picks it up."""
    return make_key(job_key, "controller-state")


def generator_node(job_key: str) -> str:
    """The node whose agent runs the job's input generator (chosen once, kept while it lives)."""
    return make_key(job_key, "generator-node")


def exits(job_key: str) -> str:
    """Hash replica id -> JSON of the agent's exit event (returncode, "" when the agent adopted
    the process and cannot know it; ...) of the job's processes that ended, copied from
    `agent_events` by the controller."""
    return make_key(job_key, "exits")


# Agents publish replica activity every second; an entry older than this says nothing.
ACTIVITY_TTL_S = 10


def replica_activity(job_key: str) -> str:
    """Hash replica id -> JSON {"cpu": share of a core in the last second, "cpu_avg": averaged
    over about 30 s, "rss_mb": resident memory of the process tree, "busy": bool, "at": time}
    written by the agent that runs the replica (expires when no agent writes it)."""
    return make_key(job_key, "activity")


def interval_requests(job_key: str) -> str:
    """Hash replica id -> JSON {"seconds": CI, "sent_at": time} of checkpoint-interval commands
    the controller sent and the replica has not yet reported in force."""
    return make_key(job_key, "interval-requests")


def exit_tails(job_key: str) -> str:
    """Hash replica id -> the last lines of the log of an ended process of the job."""
    return make_key(job_key, "exit-tails")


def agent_events_cursor(job_key: str) -> str:
    """The last `agent_events` entry id the job's controller has read."""
    return make_key(job_key, "agent-events-cursor")


def ingest_cursor(stream: str) -> str:
    """The last entry id of `stream` (a progress or node-metrics stream) stored as metrics."""
    return f"{stream}:ingest-cursor"


def fault_carried_out(fault_id: int) -> str:
    """Set (NX) by the agent that carries out a fault whose effect only it reports (kill-executor,
    kill-worker), so a redelivered task does not kill a second time."""
    return make_key("fault", fault_id, "carried-out")


def paused_groups(node: str) -> str:
    """Hash of the process groups a pause-node fault stopped on `node`: pgid -> JSON with the
    time (epoch seconds) the agent must resume them, so a restarted agent still resumes them."""
    return make_key("node", node, "paused")


def shared_data_generation() -> str:
    """Counter that every write seen by the console or the API bumps: shared page data computed
    under an older generation is stale (console/services/shared_data.py)."""
    return make_key("shared-data", "generation")


def shared_data(namespace: str, digest: str) -> str:
    """One piece of page data shared by every viewer (JSON: generation, time, value, stored)."""
    return make_key("shared-data", namespace, digest)


def shared_data_computing(namespace: str, digest: str) -> str:
    """Set while one request computes that piece of shared data; the others wait for it."""
    return make_key("shared-data", namespace, digest, "computing")


def upgrade_audit_asked(job_key: str, upgrade_id: int) -> str:
    """Set (with a TTL) while the watchdog's last request for an upgrade's audit is recent
    (console/services/upgrade_audit.py)."""
    return make_key(job_key, "upgrade-audit-asked", upgrade_id)


def upgrade_check_runner(job_key: str, upgrade_id: int) -> str:
    """The controller process running an upgrade's state check, set while it runs: the job's
    reconcile sends the check again when that process is gone
    (console/services/upgrade_state_check.py)."""
    return make_key(job_key, "upgrade-check-runner", upgrade_id)


def kafka_broker(bootstrap: str) -> str:
    """JSON registration of a Kafka broker Backstop started itself, by its address: its pid,
    data directory and the token of the process that keeps it (infra/kafka_outage.py), with a
    short TTL that process renews. Absent: no broker of Backstop's own answers there, and the
    kafka-broker fault is refused."""
    return make_key("kafka-broker", bootstrap)


def kafka_broker_outage(bootstrap: str) -> str:
    """JSON of the kafka-broker fault asked of, or carried out on, the broker at `bootstrap`:
    the fault, the keeper's token it is meant for, its duration, and its state (asked, down
    until a time, up again at a time, or refused with why)."""
    return make_key("kafka-broker", bootstrap, "outage")


def controller_job_keys(job_key: str) -> list[str]:
    """The control-plane keys of one job (its supervision state and what the controller keeps
    beside it): deleted together when the job itself is deleted from the database."""
    return [
        controller_state(job_key),
        controller_cycle(job_key),
        reconcile_failures(job_key),
        kafka_conditions(job_key),
        exits(job_key),
        exit_tails(job_key),
        interval_requests(job_key),
        agent_events_cursor(job_key),
        job_activity(job_key),
        job_alerts(job_key),
        job_strays(job_key),
    ]
