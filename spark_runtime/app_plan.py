"""The stateful operators of an app's queries, read from each query's physical plan.

An existing app (spark_runtime/apps.py) declares no operators: Backstop runs its whole script as
one operator, `app`. Once a query of the app has run a batch, its stage process reads the
query's physical plan (`StreamingQuery.explain`'s text) and finds the operators that keep
state, one per stateful node of the plan:

- StateStoreSave (a streaming aggregation): aggregate, window_aggregate when a key is a window
- SessionWindowStateStoreSave: window_aggregate
- StreamingDeduplicate (and ...WithinWatermark): aggregate (of the keys seen)
- StreamingSymmetricHashJoin (a stream-stream join): join
- TransformWithState..., FlatMapGroups...WithState: stateful
- StreamingGlobalLimit: topn

They become the job's operators beside `app` (`operator_specs`, through the same Topology and
OperatorSpec a built-in topology declares its operators with), so the policy scores them and
the console's pages show them (console/services/app_operators.py).

Pure text parsing: no Spark and no Django imports.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from spark_runtime.topology import (
    AGGREGATE,
    JOIN,
    STATEFUL,
    TOPN,
    WINDOW_AGGREGATE,
    OperatorSpec,
)

PHYSICAL_PLAN = "== Physical Plan =="
# The longest query name an operator's name keeps (Operator.name holds 64 characters).
QUERY_NAME_CHARS = 40
# What the policy assumes of a found operator until its stage's usage is measured.
FOUND_CPU, FOUND_MEM = 0.25, 256.0

# Plan node name prefix -> (label in the operator's name, kind). Checked in this order: the
# longest names first, so `SessionWindowStateStoreSave` is not read as `StateStoreSave`.
STATEFUL_NODES = (
    ("SessionWindowStateStoreSave", "session-window", WINDOW_AGGREGATE),
    ("StreamingDeduplicateWithinWatermark", "deduplicate", AGGREGATE),
    ("StreamingDeduplicate", "deduplicate", AGGREGATE),
    ("StreamingSymmetricHashJoin", "join", JOIN),
    ("TransformWithState", "transform-with-state", STATEFUL),
    ("FlatMapGroupsInPandasWithState", "map-groups-with-state", STATEFUL),
    ("FlatMapGroupsWithState", "map-groups-with-state", STATEFUL),
    ("StreamingGlobalLimit", "limit", TOPN),
    ("StateStoreSave", "aggregate", AGGREGATE),
)
# A node line: tree drawing (`+-`, `:`, spaces), an optional whole-stage codegen id `*(3) `,
# an optional `!` (Spark's mark of a node whose input it cannot resolve), then the node's name.
_NODE = re.compile(r"^[\s:|+\-]*(?:\*\(\d+\)\s*)?!?([A-Za-z][A-Za-z0-9]*)(.*)$")
_OP_ID = re.compile(r"\bopId = (\d+)")


@dataclass(frozen=True)
class FoundOperator:
    """A stateful operator of an app's query: its name among the job's operators
    (`QUERY:LABEL`), its kind, the query, the plan node it came from and Spark's operator id."""

    name: str
    kind: str
    query: str
    node: str
    op_id: int | None

    def to_dict(self) -> dict:
        """As published to Redis (keys.app_operators)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> FoundOperator:
        """One published entry; ValueError for an entry without a name or with an unknown kind."""
        kinds = {kind for _, _, kind in STATEFUL_NODES}
        if not raw.get("name") or raw.get("kind") not in kinds:
            raise ValueError(f"not a found operator: {raw!r}")
        op_id = raw.get("op_id")
        return cls(
            name=str(raw["name"]),
            kind=str(raw["kind"]),
            query=str(raw.get("query", "")),
            node=str(raw.get("node", "")),
            op_id=int(op_id) if op_id is not None else None,
        )


def _keys(rest: str) -> str:
    """The bracketed list right after a node's name (its grouping or dedup keys), or ''."""
    rest = rest.lstrip()
    if not rest.startswith("["):
        return ""
    return rest[1 : rest.find("]")] if "]" in rest else rest[1:]


def _classify(node: str, rest: str) -> tuple[str, str] | None:
    for prefix, label, kind in STATEFUL_NODES:
        if node.startswith(prefix):
            if kind == AGGREGATE and label == "aggregate":
                keys = [k.strip() for k in _keys(rest).split(",")]
                if any(k.startswith(("window#", "session_window#")) for k in keys):
                    return "window-aggregate", WINDOW_AGGREGATE
            return label, kind
    return None


def stateful_operators(plan: str, query: str) -> list[FoundOperator]:
    """The stateful operators in the physical plan `plan` of query `query`, in the order the
    data flows (the plan prints its sink first: bottom-up). Only the physical plan section is
    read when the text has several (an extended explain), so a logical `Deduplicate` or
    `Aggregate` is not counted; a StateStoreRestore is the same operator as its
    StateStoreSave and is not counted again."""
    if PHYSICAL_PLAN in plan:
        plan = plan.split(PHYSICAL_PLAN, 1)[1]
    found = []
    for line in plan.splitlines():
        match = _NODE.match(line)
        if match is None:
            continue
        node, rest = match.groups()
        classified = _classify(node, rest)
        if classified is None:
            continue
        op_id = _OP_ID.search(rest)
        found.append((classified, node, int(op_id.group(1)) if op_id else None))
    found.reverse()
    prefix = query[:QUERY_NAME_CHARS]
    counts: dict[str, int] = {}
    for (label, _kind), _node, _op in found:
        counts[label] = counts.get(label, 0) + 1
    seen: dict[str, int] = {}
    operators = []
    for (label, kind), node, op_id in found:
        seen[label] = seen.get(label, 0) + 1
        suffix = f"-{seen[label]}" if counts[label] > 1 else ""
        operators.append(FoundOperator(f"{prefix}:{label}{suffix}", kind, query, node, op_id))
    return operators


def operator_specs(found: list[FoundOperator], after: str) -> tuple[OperatorSpec, ...]:
    """The found operators as a topology's operators: each query's chain in data order, its
    first one reading `after` (the app's own operator), with the default demand estimates.
    The same name found twice (a restarted app finds its operators again) is kept once."""
    specs: list[OperatorSpec] = []
    previous: dict[str, str] = {}
    names: set[str] = set()
    for op in found:
        if op.name in names:
            continue
        names.add(op.name)
        upstream = previous.get(op.query, after)
        specs.append(
            OperatorSpec(op.name, op.kind, upstream=(upstream,), cpu=FOUND_CPU, mem=FOUND_MEM)
        )
        previous[op.query] = op.name
    return tuple(specs)
