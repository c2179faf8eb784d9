"""The job definition contract: PySpark jobs that Backstop did not write (docs/JOBS.md).

A job module in the jobs directory (`BACKSTOP_JOBS_DIR`) declares a `JobDefinition`: its input
fields, its operators (each processing operator with a function from a DataFrame to a DataFrame,
written with the ordinary DataFrame API) and how results are written (`Upsert` into the results
hash by key, or `Append` to the output stream, once per key). Backstop adds the provenance its
idempotent sinks need around the user's functions (spark_runtime/user_plan.py), so the functions
never see input offsets, record ids of Backstop's own or fencing epochs.

A registered version of a job is a snapshot of its module under `<jobs dir>/.registered/`; a job
runs as the topology `NAME@VERSION` (`resolve_topology`), so a running job keeps the code it
started with when the module is edited or registered again.

This module holds no Spark and no Django code: the stage process, the controller and the policy
import it cheaply. Importing a user module runs its top level, so only modules from the jobs
directory are imported (`load_definition`).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from spark_runtime.apps import AppDefinition, load_app_snapshot
from spark_runtime.env import env
from spark_runtime.topology import (
    OPERATOR_KINDS,
    OUT_CHANNEL,
    RESULTS_CHANNEL,
    SINK,
    SOURCE,
    STATEFUL_KINDS,
    TOPOLOGIES,
    OperatorSpec,
    Topology,
    get_topology,
)

FIELD_TYPES = ("string", "int", "double")
# Columns Backstop gives every input row; declared fields must not reuse them.
ID_COLUMN = "id"
EVENT_TIME_COLUMN = "event_time"
RESERVED_COLUMNS = frozenset({ID_COLUMN, EVENT_TIME_COLUMN, "ts", "pos", "entry"})
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
REF_PATTERN = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
REGISTERED_DIR = ".registered"
VERSION_SEPARATOR = "@"
MAX_PARALLELISM = 64  # state partitions of a user job's stateful operator


class JobDefinitionError(ValueError):
    """A job definition that breaks the contract; `errors` lists every problem found."""

    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class Operator:
    """One operator of a user job.

    `kind` is one of spark_runtime.topology.OPERATOR_KINDS: the policy scores the operator by it
    (stateless kinds low, aggregations and joins high) and a stateful kind runs its query in
    update mode. `function` (required for every operator but the source and the sink) takes the
    DataFrame of its upstream operator and returns a DataFrame. `cpu` (cores) and `mem` (MiB) are
    the estimates the policy uses until the operator has been measured. `parallelism` is the
    number of partitions of a stateful operator's state (Spark's shuffle partitions for the
    job's query, so the number of tasks that keep it); a stateless operator runs in its input's
    partitions and keeps 1.
    """

    name: str
    kind: str
    upstream: tuple[str, ...] = ()
    function: Callable | None = None
    parallelism: int = 1
    cpu: float = 0.25
    mem: float = 256.0


@dataclass(frozen=True)
class Upsert:
    """Results go to the job's results hash: one entry per distinct value of the `key` columns,
    holding the other columns as a JSON object, replaced by newer values."""

    key: tuple[str, ...]


@dataclass(frozen=True)
class Append:
    """Results are appended to the job's output stream, each distinct value of the `key` columns
    once (a row with a key already written is dropped)."""

    key: tuple[str, ...]


@dataclass(frozen=True)
class JobDefinition:
    """A user job: what its input entries hold, its operators and how results are written.

    - `input_fields`: payload field name -> `string`, `int` or `double`. Every entry of the input
      stream also carries `id` (unique) and `ts` (event time, epoch ms); the first operator sees
      the columns `id`, `event_time` (a timestamp made from `ts`) and the declared fields.
    - `generate(rng) -> dict` (optional): one entry's payload from a seeded `random.Random`; the
      demo, the tests and the benchmark feed the job with it.
    - `reference(rows) -> dict` (optional): the job's results computed in plain Python from the
      input rows (dicts with the columns the first operator sees), as `{key text: {column: value}}`;
      the benchmark and the recovery audit compare the real results with it.
    """

    name: str
    input_fields: dict[str, str]
    operators: tuple[Operator, ...]
    output: Upsert | Append
    description: str = ""
    generate: Callable | None = None
    reference: Callable | None = None
    params: dict = field(default_factory=dict)

    @property
    def parallelism(self) -> int:
        """The job's state partitions: its stateful operator's parallelism (1 without one)."""
        return max((op.parallelism for op in self.operators), default=1)

    @property
    def final_channel(self) -> str:
        """Where results go: the results hash (`Upsert`) or the output stream (`Append`)."""
        return RESULTS_CHANNEL if isinstance(self.output, Upsert) else OUT_CHANNEL

    def processing_operators(self) -> list[Operator]:
        """The operators with a function, in chain order (the contract requires a chain)."""
        order = {op.name: op for op in self.operators}
        chain: list[Operator] = []
        current = next(op for op in self.operators if op.kind == SOURCE)
        while True:
            readers = [op for op in self.operators if current.name in op.upstream]
            if not readers or readers[0].kind == SINK:
                return chain
            current = order[readers[0].name]
            chain.append(current)

    def to_topology(self, version: int | None = None) -> Topology:
        """The topology the data plane and the policy run, named `NAME@VERSION`."""
        name = self.name if version is None else f"{self.name}{VERSION_SEPARATOR}{version}"
        ops = tuple(
            OperatorSpec(
                op.name,
                op.kind,
                upstream=tuple(op.upstream),
                # One parallelism for the whole chain: its operators chain into one stage.
                parallelism=self.parallelism,
                cpu=op.cpu,
                mem=op.mem,
            )
            for op in self.operators
        )
        return Topology(name=name, operators=ops, description=self.description, job=self)


def validate(definition) -> list[str]:
    """Every way `definition` breaks the contract, as messages naming the operator or field
    (empty when it is a valid JobDefinition). No Spark: the dry run (user_plan.dry_run) checks
    the functions against Spark afterwards."""
    if not isinstance(definition, JobDefinition):
        return [f"expected a JobDefinition, got {type(definition).__name__}"]
    errors = []
    if not NAME_PATTERN.match(definition.name or ""):
        errors.append(
            f"name {definition.name!r}: lower-case letters, digits and _, starting with a letter"
        )
    elif definition.name in TOPOLOGIES:
        errors.append(f"name {definition.name!r}: taken by a built-in topology")
    if not isinstance(definition.input_fields, dict) or not definition.input_fields:
        errors.append("input_fields: declare at least one payload field")
    else:
        for name, kind in definition.input_fields.items():
            if name in RESERVED_COLUMNS:
                errors.append(
                    f"input field {name!r}: reserved ({', '.join(sorted(RESERVED_COLUMNS))})"
                )
            if kind not in FIELD_TYPES:
                errors.append(f"input field {name!r}: unknown type {kind!r}; one of {FIELD_TYPES}")
    errors += _operator_errors(definition.operators)
    if not isinstance(definition.output, Upsert | Append):
        errors.append("output: Upsert(key=...) or Append(key=...)")
    elif not definition.output.key or not all(isinstance(k, str) for k in definition.output.key):
        errors.append("output: key must name at least one column")
    for hook in ("generate", "reference"):
        if getattr(definition, hook) is not None and not callable(getattr(definition, hook)):
            errors.append(f"{hook}: must be a function")
    return errors


def _operator_errors(operators) -> list[str]:
    if not operators:
        return ["operators: none declared"]
    errors = []
    names = [getattr(op, "name", None) for op in operators]
    for name in sorted({n for n in names if names.count(n) > 1}, key=str):
        errors.append(f"operator {name!r}: declared twice")
    known = set(names)
    for op in operators:
        if not isinstance(op, Operator):
            errors.append(f"operators: expected Operator, got {type(op).__name__}")
            continue
        if op.kind not in OPERATOR_KINDS:
            errors.append(
                f"operator {op.name!r}: unknown kind {op.kind!r}; one of {OPERATOR_KINDS}"
            )
        for up in op.upstream:
            if up not in known:
                errors.append(f"operator {op.name!r}: unknown upstream {up!r}")
        if op.kind in (SOURCE, SINK):
            if op.function is not None:
                errors.append(f"operator {op.name!r}: a {op.kind} takes no function")
        elif not callable(op.function):
            errors.append(f"operator {op.name!r}: missing function (DataFrame -> DataFrame)")
        if op.kind == SOURCE and op.upstream:
            errors.append(f"operator {op.name!r}: a source has no upstream")
        if op.kind != SOURCE and len(op.upstream) != 1:
            errors.append(
                f"operator {op.name!r}: reads {len(op.upstream)} operators; user jobs are a chain "
                "(one upstream each; a join of two kinds of records is one operator whose "
                "function splits and joins its input)"
            )
        whole = isinstance(op.parallelism, int) and not isinstance(op.parallelism, bool)
        if not whole or not 1 <= op.parallelism <= MAX_PARALLELISM:
            errors.append(
                f"operator {op.name!r}: parallelism must be a whole number in [1, "
                f"{MAX_PARALLELISM}]"
            )
        elif op.parallelism > 1 and op.kind not in STATEFUL_KINDS:
            errors.append(
                f"operator {op.name!r}: parallelism is the number of state partitions of a "
                f"stateful operator; a {op.kind} runs in its input's partitions (keep 1)"
            )
    if errors:
        return errors
    kinds = [op.kind for op in operators]
    if kinds.count(SOURCE) != 1 or kinds.count(SINK) != 1:
        errors.append("operators: exactly one source and one sink")
    try:
        Topology(
            name="check",
            operators=tuple(OperatorSpec(o.name, o.kind, o.upstream) for o in operators),
        )
    except ValueError as exc:
        errors.append(f"operators: {exc}".replace("topology 'check' ", ""))
        return errors
    readers: dict[str, list[str]] = {}
    for op in operators:
        for up in op.upstream:
            readers.setdefault(up, []).append(op.name)
    for name, names_reading in readers.items():
        if len(names_reading) > 1:
            errors.append(f"operator {name!r}: read by {names_reading}; user jobs are a chain")
    stateful = [op.name for op in operators if OperatorSpec(op.name, op.kind).stateful]
    if len(stateful) > 1:
        errors.append(
            f"operators {stateful}: at most one stateful operator per user job (two would need a "
            "stage boundary with an intermediate stream, not supported for user jobs yet)"
        )
    return errors


# --- loading ----------------------------------------------------------------------------------


def jobs_dir() -> Path:
    """The allow-listed jobs directory: env BACKSTOP_JOBS_DIR, else `jobs/` in the project."""
    configured = env("BACKSTOP_JOBS_DIR", "")
    return Path(configured) if configured else Path(__file__).resolve().parent.parent / "jobs"


def module_path(ref: str, directory: Path | None = None) -> Path:
    """The file of `package.module:attribute` inside the jobs directory; ValueError for a
    reference that is malformed or points outside it."""
    if not REF_PATTERN.match(ref or ""):
        raise ValueError(f"module reference {ref!r}: expected package.module:attribute")
    base = (directory or jobs_dir()).resolve()
    module = ref.partition(":")[0]
    path = (base / Path(*module.split("."))).with_suffix(".py").resolve()
    if base not in path.parents:
        raise ValueError(f"module reference {ref!r}: outside the jobs directory {base}")
    if not path.is_file():
        raise ValueError(f"module reference {ref!r}: no file {path.relative_to(base)} in {base}")
    return path


def load_file(path: Path, attribute: str, module_name: str):
    """Import the module file `path` under `module_name` and return its `attribute`."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    # Spark's workers cannot import a job module (it is not on their path): functions that run
    # on them (UDFs, applyInPandasWithState) travel by value instead of by module reference.
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"{path.name}: no attribute {attribute!r}") from None


def load_definition(ref: str, directory: Path | None = None) -> JobDefinition:
    """Import `package.module:attribute` from the jobs directory and check it against the
    contract; JobDefinitionError lists every problem."""
    path = module_path(ref, directory)
    definition = load_file(path, ref.partition(":")[2], "backstop_jobs." + ref.partition(":")[0])
    errors = validate(definition)
    if errors:
        raise JobDefinitionError(errors)
    return definition


def registered_path(name: str, version: int, directory: Path | None = None) -> Path:
    """Where version `version` of job `name` keeps its module snapshot."""
    return (directory or jobs_dir()) / REGISTERED_DIR / name / f"v{version}.py"


# Registered versions never change, so each is imported once per process.
_LOADED: dict[tuple[Path, str], JobDefinition] = {}


def load_registered(ident: str, directory: Path | None = None) -> JobDefinition | AppDefinition:
    """The definition of a registered version, `NAME@VERSION` (its snapshot; see module doc):
    a job module's JobDefinition, or an app's AppDefinition (spark_runtime/apps.py)."""
    cache_key = ((directory or jobs_dir()).resolve(), ident)
    if cache_key not in _LOADED:
        _LOADED[cache_key] = _load_registered(ident, directory)
    return _LOADED[cache_key]


def _load_registered(ident: str, directory: Path | None) -> JobDefinition | AppDefinition:
    path = _snapshot_file(ident, directory)
    app = load_app_snapshot(path, ident.partition(VERSION_SEPARATOR)[0])
    if app is not None:
        return app
    name, _, version = ident.partition(VERSION_SEPARATOR)
    ref_attr = _registered_attribute(path)
    definition = load_file(path, ref_attr, f"backstop_jobs.registered.{name}_v{version}")
    errors = validate(definition)
    if errors:
        raise JobDefinitionError(errors)
    return definition


def _snapshot_file(ident: str, directory: Path | None) -> Path:
    """The snapshot file of `NAME@VERSION`; KeyError when there is none."""
    name, _, version = ident.partition(VERSION_SEPARATOR)
    if not version.isdigit():
        raise KeyError(f"unknown topology {ident!r}")
    path = registered_path(name, int(version), directory)
    if not path.is_file():
        raise KeyError(f"topology {ident!r}: no registered snapshot at {path}")
    return path


def registered_app(name: str, directory: Path | None = None) -> AppDefinition | None:
    """The app that topology `name` runs, or None for a built-in topology or a job module
    (only the snapshot's first line is read: a job module is not imported here)."""
    if not is_registered_ident(name):
        return None
    try:
        path = _snapshot_file(name, directory)
    except KeyError:
        return None
    return load_app_snapshot(path, name.partition(VERSION_SEPARATOR)[0])


ATTRIBUTE_MARKER = "# backstop: definition = "


def _registered_attribute(path: Path) -> str:
    """The attribute a snapshot's definition lives in (its first line names it)."""
    first = path.read_text().splitlines()[0] if path.stat().st_size else ""
    if not first.startswith(ATTRIBUTE_MARKER):
        raise KeyError(f"{path}: not a Backstop snapshot (first line {first[:60]!r})")
    return first[len(ATTRIBUTE_MARKER) :].strip()


def snapshot_source(ref: str, directory: Path | None = None) -> str:
    """The text a registration stores: the module's source under a first line naming the
    definition's attribute."""
    path = module_path(ref, directory)
    return f"{ATTRIBUTE_MARKER}{ref.partition(':')[2]}\n{path.read_text()}"


def is_registered_ident(name: str) -> bool:
    """True for `NAME@VERSION` (a registered user job), False for a built-in topology name."""
    return VERSION_SEPARATOR in name


def resolve_topology(name: str, directory: Path | None = None) -> Topology:
    """A built-in topology by name, or a registered user job by `NAME@VERSION`."""
    if not is_registered_ident(name):
        return get_topology(name)
    version = int(name.partition(VERSION_SEPARATOR)[2])
    return load_registered(name, directory).to_topology(version)
