"""Declarative operator DAGs: the jobs Backstop knows how to run.

This module is the shared vocabulary of the data plane (which compiles a topology into Structured
Streaming queries) and the policy (which scores each operator). It holds no Spark code and no
Django code, so both sides can import it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spark_runtime import keys

# Operator kinds. The policy maps them to Da-Stream type scores (stateless 0.1, aggregation 0.5,
# join or other stateful operators such as windows, top-N and an app's arbitrary state 0.8).
SOURCE = "source"
MAP = "map"
FILTER = "filter"
FLATMAP = "flatmap"
AGGREGATE = "aggregate"
WINDOW_AGGREGATE = "window_aggregate"
JOIN = "join"
TOPN = "topn"
# State the code keeps as it likes: transformWithState, (flat)mapGroupsWithState.
STATEFUL = "stateful"
SINK = "sink"

OPERATOR_KINDS = (
    SOURCE, MAP, FILTER, FLATMAP, AGGREGATE, WINDOW_AGGREGATE, JOIN, TOPN, STATEFUL, SINK,
)  # fmt: skip
STATEFUL_KINDS = frozenset({AGGREGATE, WINDOW_AGGREGATE, JOIN, TOPN, STATEFUL})


@dataclass(frozen=True)
class OperatorSpec:
    """One operator of a topology.

    `upstream` names the operators whose output this one reads; `params` carries kind-specific
    settings (window length, N of top-N, selectivity...). `cpu` and `mem` are the default demand
    estimates (cores, MiB) the policy uses until measured figures exist.
    """

    name: str
    kind: str
    upstream: tuple[str, ...] = ()
    parallelism: int = 1
    params: dict = field(default_factory=dict)
    cpu: float = 0.25
    mem: float = 256.0

    def __post_init__(self):
        if self.kind not in OPERATOR_KINDS:
            raise ValueError(f"operator {self.name!r}: unknown kind {self.kind!r}")
        if self.parallelism < 1:
            raise ValueError(f"operator {self.name!r}: parallelism must be >= 1")

    @property
    def stateful(self) -> bool:
        return self.kind in STATEFUL_KINDS


# A stage's micro-batch trigger unless its topology says otherwise: sub-second latency where a
# batch is light (wordcount at 50 events/s used 65-68% of a core with it, docs/RESULTS.md).
DEFAULT_TRIGGER_S = 0.5


@dataclass(frozen=True)
class Topology:
    """A named DAG of operators. Edges are given by each operator's `upstream` names.
    `trigger_s`: the micro-batch trigger of its stages, under every strategy."""

    name: str
    operators: tuple[OperatorSpec, ...]
    description: str = ""
    trigger_s: float = DEFAULT_TRIGGER_S
    # A user job's spark_runtime.jobdef.JobDefinition (None for a built-in topology): its
    # operators' functions and how its results are written.
    job: object = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        names = [op.name for op in self.operators]
        if len(names) != len(set(names)):
            raise ValueError(f"topology {self.name!r}: duplicate operator names")
        known = set(names)
        for op in self.operators:
            missing = [u for u in op.upstream if u not in known]
            if missing:
                raise ValueError(f"topology {self.name!r}: {op.name!r} reads unknown {missing}")
        self.topological_order()  # raises on cycles

    def operator(self, name: str) -> OperatorSpec:
        for op in self.operators:
            if op.name == name:
                return op
        raise KeyError(f"topology {self.name!r} has no operator {name!r}")

    def downstream(self, name: str) -> tuple[str, ...]:
        """Names of the operators that read `name`'s output."""
        return tuple(op.name for op in self.operators if name in op.upstream)

    def topological_order(self) -> list[OperatorSpec]:
        """Operators sorted so that each comes after everything it reads; raises on a cycle."""
        done: list[OperatorSpec] = []
        placed: set[str] = set()
        pending = list(self.operators)
        while pending:
            ready = [op for op in pending if all(u in placed for u in op.upstream)]
            if not ready:
                raise ValueError(
                    f"topology {self.name!r} has a cycle through {cycle_members(pending)}"
                )
            for op in ready:
                done.append(op)
                placed.add(op.name)
                pending.remove(op)
        return done


def cycle_members(stuck: list[OperatorSpec]) -> str:
    """The operators of `stuck` (none of which can be ordered) that lie on a cycle, named: the
    ones downstream of a cycle, which nothing else among them reads, are dropped one by one."""
    remaining = list(stuck)
    while True:
        read = {u for op in remaining for u in op.upstream}
        kept = [op for op in remaining if op.name in read]
        if len(kept) == len(remaining):
            return ", ".join(repr(op.name) for op in kept)
        remaining = kept


WORDCOUNT_JOB = Topology(
    name="wordcount",
    description="Da-Stream's evaluation job: split lines into words and count each word.",
    # A 0.3 s trigger: its fused stage's batch costs about 0.17-0.19 s of CPU at 50 events/s
    # since the listener and checkpoint-file changes (spark_runtime/listener.py, config.py),
    # 56% of a core at 0.3 s against 70% at 0.5 s before them, for a p50 of 279 ms instead of
    # 345 ms; 0.2 s took 91% for 248 ms (docs/RESULTS.md, "Batch cost against the trigger").
    trigger_s=0.3,
    operators=(
        OperatorSpec("source", SOURCE, cpu=0.1, mem=128),
        OperatorSpec("split", FLATMAP, upstream=("source",), cpu=0.3, mem=256),
        OperatorSpec("count", AGGREGATE, upstream=("split",), cpu=0.5, mem=512),
        OperatorSpec("sink", SINK, upstream=("count",), cpu=0.1, mem=128),
    ),
)

TOPN_JOB = Topology(
    name="topn",
    description="Da-Stream's Top-N job: count items per tumbling window, keep the N most frequent.",
    # The default 0.5 s trigger: where window_count and topn share a stage one query runs both
    # (pipelines.FUSED_PLANS), a batch of about 0.31 s of CPU at 50 events/s, nearly all of it
    # fixed (62% of a core at 0.5 s, 32% at 1 s, 17% at 2 s). As two queries a batch of each
    # cost twice that (49% at 1 s, 26% at 2 s, 2026-11-26; 1.42 cores at 0.5 s with the JVM's
    # default options, 2026-11-25), so topn ran at 2 s, and every result (a failover's first
    # too) waited for a trigger of each query: docs/RESULTS.md, "Batch cost".
    operators=(
        OperatorSpec("source", SOURCE, cpu=0.1, mem=128),
        OperatorSpec(
            "window_count",
            WINDOW_AGGREGATE,
            upstream=("source",),
            params={"window_seconds": 10, "watermark_seconds": 30},
            cpu=0.5,
            mem=512,
        ),
        OperatorSpec(
            "topn",
            TOPN,
            upstream=("window_count",),
            params={"n": 5, "watermark_seconds": 30},
            cpu=0.3,
            mem=256,
        ),
        OperatorSpec("sink", SINK, upstream=("topn",), cpu=0.1, mem=128),
    ),
)

TRAFFIC_JOB = Topology(
    name="traffic",
    description="OSPBench's pipeline: join speed and flow per sensor lane and second, then "
    "average speed and total flow per location.",
    operators=(
        OperatorSpec("speed_source", SOURCE, cpu=0.1, mem=128),
        OperatorSpec("flow_source", SOURCE, cpu=0.1, mem=128),
        OperatorSpec(
            "join",
            JOIN,
            upstream=("speed_source", "flow_source"),
            params={"watermark_seconds": 30},
            cpu=0.6,
            mem=768,
        ),
        OperatorSpec(
            "location_aggregate",
            WINDOW_AGGREGATE,
            upstream=("join",),
            params={"window_seconds": 1, "watermark_seconds": 30},
            cpu=0.4,
            mem=512,
        ),
        OperatorSpec("sink", SINK, upstream=("location_aggregate",), cpu=0.1, mem=128),
    ),
)

SHUFFLE_JOB = Topology(
    name="shuffle",
    description="ShuffleBench's shape: assign records to keys, aggregate per key with state, "
    "emit outputs with a set selectivity.",
    operators=(
        OperatorSpec("source", SOURCE, cpu=0.1, mem=128),
        OperatorSpec("assign_keys", MAP, upstream=("source",), params={"keys": 100}, cpu=0.2),
        OperatorSpec(
            "aggregate",
            AGGREGATE,
            upstream=("assign_keys",),
            params={"selectivity": 0.01},
            cpu=0.5,
            mem=512,
        ),
        OperatorSpec("sink", SINK, upstream=("aggregate",), cpu=0.1, mem=128),
    ),
)

TOPOLOGIES: dict[str, Topology] = {
    t.name: t for t in (WORDCOUNT_JOB, TOPN_JOB, TRAFFIC_JOB, SHUFFLE_JOB)
}


def get_topology(name: str) -> Topology:
    """Return the topology called `name`, or raise KeyError listing the known ones."""
    try:
        return TOPOLOGIES[name]
    except KeyError:
        raise KeyError(f"unknown topology {name!r}; known: {sorted(TOPOLOGIES)}") from None


# --- Stage cutting (data plane) --------------------------------------------------------------
# A stage is one process (a primary, optionally a hot standby) running one or more Structured
# Streaming queries that read Redis streams and write a Redis stream or the final sink. Sources
# are not stages (they are the input stream); a sink runs inside the stage of the operator it
# reads. How operators are grouped into stages is the strategy's chaining rule (see
# `compile_stages` and docs/DATA_PLANE.md):
#
# - `fused`: the whole job is one stage (restart-all, the plain Spark way);
# - `per-operator`: every processing operator is its own stage (micro-benchmarks only);
# - `per-stateful`: a stateless operator chains into its stateful neighbour's stage, and every
#   stateful operator starts a stage of its own (local-restart: restart only the failed part);
# - `chained`: like Flink's operator chaining, a boundary only where it buys something: where the
#   parallelism changes, or where the policy gives two stateful operators different protection
#   (one active, one passive). Two stateful operators with the same protection share a stage
#   (one process, one standby): as one query where a fused plan runs them as one operator
#   (topn), else as two queries linked by a Redis stream (traffic).

FUSED = "fused"
PER_OPERATOR = "per-operator"
PER_STATEFUL = "per-stateful"
CHAINED = "chained"
CHAINING_RULES = (FUSED, PER_OPERATOR, PER_STATEFUL, CHAINED)
FUSED_STAGE = "job"

INPUT_CHANNEL = "in"
RESULTS_CHANNEL = "results"
OUT_CHANNEL = "out"

# Final outputs beyond the results hash, per topology (shuffle also emits records).
EXTRA_OUTPUTS: dict[str, tuple[str, ...]] = {"shuffle": (OUT_CHANNEL,)}


@dataclass(frozen=True)
class SegmentSpec:
    """One Structured Streaming query: a chain of operators from input channels to outputs.

    Channels are named: `in` (the job input), `results` and `out` (final outputs), or the name of
    the operator whose output an intermediate stream carries.
    """

    operators: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class StageSpec:
    """A unit of supervision: one process (primary, optionally a hot standby) running one or
    more queries. `input_keys`/`output_keys` are Redis keys (with `{job}` left in when compiled
    without a job id)."""

    name: str
    operators: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    segments: tuple[SegmentSpec, ...]
    stateful: bool
    input_keys: tuple[str, ...] = ()
    output_keys: tuple[str, ...] = ()


def channel_key(job: str, channel: str) -> str:
    """The Redis key of a named channel of `job`."""
    if channel == INPUT_CHANNEL:
        return keys.input_stream(job)
    if channel == RESULTS_CHANNEL:
        return keys.results(job)
    if channel == OUT_CHANNEL:
        return keys.output_stream(job)
    return keys.channel_stream(job, channel)


def with_params(topology: Topology, overrides: dict[str, dict]) -> Topology:
    """A copy of `topology` with operator params updated, e.g. `{"aggregate": {"keys": 10}}`."""
    from dataclasses import replace

    ops = tuple(
        replace(op, params={**op.params, **overrides.get(op.name, {})}) for op in topology.operators
    )
    return replace(topology, operators=ops)


def _operator_segments(topology: Topology) -> list[SegmentSpec]:
    """One segment per processing operator (not source, not sink), in topological order."""
    segments = []
    for op in topology.topological_order():
        if op.kind in (SOURCE, SINK):
            continue
        inputs = []
        for up in op.upstream:
            channel = INPUT_CHANNEL if topology.operator(up).kind == SOURCE else up
            if channel not in inputs:
                inputs.append(channel)
        downstream = [topology.operator(d) for d in topology.downstream(op.name)]
        if any(d.kind == SINK for d in downstream) and topology.job is not None:
            outputs = (topology.job.final_channel,)
        elif any(d.kind == SINK for d in downstream):
            outputs = (RESULTS_CHANNEL, *EXTRA_OUTPUTS.get(topology.name, ()))
        else:
            outputs = (op.name,)
        segments.append(SegmentSpec((op.name,), tuple(inputs), outputs))
    return segments


# Consecutive operators of a built-in topology that one Spark plan runs as one operator
# (spark_runtime.pipelines.FUSED_PLANS holds the plan of each): topn's windowed count and its
# ranking, two stateful operators Spark could not chain in one query otherwise.
FUSED_OPERATORS: frozenset[tuple[str, tuple[str, ...]]] = frozenset(
    {("topn", ("window_count", "topn"))}
)


def runs_as_one(topology: Topology, operators: tuple[str, ...]) -> bool:
    """Whether one plan runs `operators` (consecutive, each reading the one before) as one
    operator: never for a user job's operators."""
    return topology.job is None and (topology.name, tuple(operators)) in FUSED_OPERATORS


def _fuse(topology: Topology, segments: list[SegmentSpec]) -> list[SegmentSpec]:
    """Merge consecutive segments into one query where Spark allows it: a query may hold at most
    one stateful operator here (Spark cannot chain two update-mode aggregations), so a segment
    is cut before a stateful operator that follows another one, unless a fused plan runs the
    two as one operator (FUSED_OPERATORS)."""
    fused: list[SegmentSpec] = []
    for seg in segments:
        if fused:
            prev = fused[-1]
            prev_stateful = any(topology.operator(o).stateful for o in prev.operators)
            this_stateful = any(topology.operator(o).stateful for o in seg.operators)
            chained = seg.inputs == (prev.outputs[0],)
            one_plan = runs_as_one(topology, prev.operators + seg.operators)
            if chained and (one_plan or not (prev_stateful and this_stateful)):
                fused[-1] = SegmentSpec(prev.operators + seg.operators, prev.inputs, seg.outputs)
                continue
        fused.append(seg)
    return fused


def _chains_into(topology: Topology, op: OperatorSpec) -> str | None:
    """The operator `op` may chain onto: its only upstream, when that is a processing operator
    whose only reader is `op` and whose parallelism is the same (a forward edge, as in Flink)."""
    if len(op.upstream) != 1:
        return None
    up = topology.operator(op.upstream[0])
    if up.kind in (SOURCE, SINK) or up.parallelism != op.parallelism:
        return None
    readers = [d for d in topology.downstream(up.name) if topology.operator(d).kind != SINK]
    return up.name if readers == [op.name] else None


def _group_operators(topology: Topology, chaining: str, active: frozenset[str]) -> list[list[str]]:
    """Processing operators grouped into stages by the chaining rule, in topological order."""
    processing = [op for op in topology.topological_order() if op.kind not in (SOURCE, SINK)]
    if chaining == FUSED:
        return [[op.name for op in processing]]
    groups: list[list[str]] = []
    group_of: dict[str, int] = {}
    for op in processing:
        up = _chains_into(topology, op) if chaining != PER_OPERATOR else None
        target = group_of.get(up) if up else None
        if target is not None and op.stateful:
            stateful = [topology.operator(o) for o in groups[target]]
            stateful = [o for o in stateful if o.stateful]
            if stateful and chaining == PER_STATEFUL:
                target = None  # every stateful operator restarts on its own
            elif any((o.name in active) != (op.name in active) for o in stateful):
                target = None  # the policy protects the two parts differently
        if target is None:
            groups.append([op.name])
            group_of[op.name] = len(groups) - 1
        else:
            groups[target].append(op.name)
            group_of[op.name] = target
    return groups


def stage_spec(
    topology: Topology, name: str, operators: tuple[str, ...] | list[str], job: str | None = None
) -> StageSpec:
    """The stage called `name` running `operators` (processing operators of `topology`), with
    its queries and channels. With `job`, it carries the real Redis keys of its inputs and
    outputs. A stage process rebuilds its spec from its operator list with this function."""
    members = set(operators)
    segments = [s for s in _operator_segments(topology) if s.operators[0] in members]
    segs = _fuse(topology, segments)
    ops = tuple(o for s in segs for o in s.operators)
    produced = {s.outputs[0] for s in segs}
    inputs = tuple(dict.fromkeys(c for s in segs for c in s.inputs if c not in produced))
    consumed = {c for s in segs for c in s.inputs}
    outputs = tuple(dict.fromkeys(c for s in segs for c in s.outputs if c not in consumed))
    job_id = job if job is not None else "{job}"
    return StageSpec(
        name=name,
        operators=ops,
        inputs=inputs,
        outputs=outputs,
        segments=tuple(segs),
        stateful=any(topology.operator(o).stateful for o in ops),
        input_keys=tuple(channel_key(job_id, c) for c in inputs),
        output_keys=tuple(channel_key(job_id, c) for c in outputs),
    )


def compile_stages(
    topology: Topology,
    chaining: str = PER_OPERATOR,
    active: frozenset[str] | set[str] = frozenset(),
    job: str | None = None,
) -> list[StageSpec]:
    """Cut `topology` into stages by the chaining rule (see the comment above `FUSED`).

    `active` names the operators the policy protects with a hot standby; under `chained` two
    stateful operators with different protection go to different stages. A stage is named after
    its first stateful operator (else its first operator); the fused stage is called `job`.
    Within a stage, operators are fused into as few queries as Spark allows.
    """
    if chaining not in CHAINING_RULES:
        raise ValueError(f"unknown chaining rule {chaining!r}; known: {CHAINING_RULES}")
    stages = []
    for group in _group_operators(topology, chaining, frozenset(active)):
        if chaining == FUSED:
            name = FUSED_STAGE
        else:
            stateful = [o for o in group if topology.operator(o).stateful]
            name = (stateful or group)[0]
        stages.append(stage_spec(topology, name, group, job))
    return stages


def stage_of(topology: Topology, stages: list[StageSpec], operator: str) -> str:
    """The name of the stage running `operator`: a source maps to the first stage reading it,
    a sink to the stage writing the results, any other operator to the stage containing it."""
    op = topology.operator(operator)
    if op.kind == SOURCE:
        candidates = topology.downstream(operator)
    elif op.kind == SINK:
        candidates = op.upstream
    else:
        candidates = (operator,)
    for stage in stages:
        if any(name in stage.operators for name in candidates):
            return stage.name
    raise KeyError(f"operator {operator!r} is in no stage")
