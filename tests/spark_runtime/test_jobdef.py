"""The job definition contract without Spark: validation messages, loading only from the jobs
directory, registered snapshots, and how a user job compiles into stages."""

from __future__ import annotations

import pytest

from spark_runtime.jobdef import (
    Append,
    JobDefinition,
    JobDefinitionError,
    Operator,
    Upsert,
    load_definition,
    module_path,
    registered_path,
    resolve_topology,
    snapshot_source,
    validate,
)
from spark_runtime.topology import (
    CHAINED,
    FUSED,
    OUT_CHANNEL,
    PER_STATEFUL,
    RESULTS_CHANNEL,
    compile_stages,
)


def identity(df):
    return df


def job(*operators, **changes):
    fields = {
        "name": "clicks",
        "input_fields": {"user": "string", "n": "int"},
        "operators": operators
        or (
            Operator("in", "source"),
            Operator("parse", "map", upstream=("in",), function=identity),
            Operator("count", "aggregate", upstream=("parse",), function=identity),
            Operator("out", "sink", upstream=("count",)),
        ),
        "output": Upsert(key=("user",)),
    }
    fields.update(changes)
    return JobDefinition(**fields)


def test_a_valid_job_has_no_errors_and_compiles_into_one_stage_under_every_rule():
    definition = job()
    assert validate(definition) == []
    topology = definition.to_topology(3)
    assert topology.name == "clicks@3"
    for rule in (FUSED, PER_STATEFUL, CHAINED):
        (stage,) = compile_stages(topology, rule, job="j")
        assert stage.operators == ("parse", "count")
        assert stage.outputs == (RESULTS_CHANNEL,)
    appending = job(output=Append(key=("user",))).to_topology(1)
    assert compile_stages(appending, CHAINED)[0].outputs == (OUT_CHANNEL,)


@pytest.mark.parametrize(
    ("definition", "message"),
    [
        (
            job(
                Operator("in", "source"),
                Operator("x", "sorcery", upstream=("in",), function=identity),
                Operator("out", "sink", upstream=("x",)),
            ),
            "operator 'x': unknown kind 'sorcery'",
        ),
        (
            job(
                Operator("in", "source"),
                Operator("x", "map", upstream=("nowhere",), function=identity),
                Operator("out", "sink", upstream=("x",)),
            ),
            "operator 'x': unknown upstream 'nowhere'",
        ),
        (
            job(
                Operator("in", "source"),
                Operator("x", "map", upstream=("in",)),
                Operator("out", "sink", upstream=("x",)),
            ),
            "operator 'x': missing function (DataFrame -> DataFrame)",
        ),
        (
            job(
                Operator("in", "source"),
                Operator("a", "map", upstream=("b",), function=identity),
                Operator("b", "map", upstream=("a",), function=identity),
                Operator("out", "sink", upstream=("b",)),
            ),
            "operators: has a cycle through 'a', 'b'",
        ),
        (
            job(
                Operator("in", "source"),
                Operator("a", "aggregate", upstream=("in",), function=identity),
                Operator("b", "join", upstream=("a",), function=identity),
                Operator("out", "sink", upstream=("b",)),
            ),
            "operators ['a', 'b']: at most one stateful operator",
        ),
        (job(input_fields={"ts": "int"}), "input field 'ts': reserved"),
        (job(input_fields={"user": "timestamp"}), "input field 'user': unknown type 'timestamp'"),
        (job(name="wordcount"), "name 'wordcount': taken by a built-in topology"),
        (job(output=Upsert(key=())), "output: key must name at least one column"),
        (
            job(
                Operator("in", "source"),
                Operator("parse", "map", upstream=("in",), function=identity, parallelism=2),
                Operator("out", "sink", upstream=("parse",)),
            ),
            "operator 'parse': parallelism is the number of state partitions of a stateful "
            "operator; a map runs in its input's partitions (keep 1)",
        ),
        (
            job(
                Operator("in", "source"),
                Operator("count", "aggregate", upstream=("in",), function=identity, parallelism=0),
                Operator("out", "sink", upstream=("count",)),
            ),
            "operator 'count': parallelism must be a whole number in [1, 64]",
        ),
        (
            job(
                Operator("in", "source"),
                Operator(
                    "count", "aggregate", upstream=("in",), function=identity, parallelism=True
                ),
                Operator("out", "sink", upstream=("count",)),
            ),
            "operator 'count': parallelism must be a whole number in [1, 64]",
        ),
    ],
)
def test_each_contract_error_names_the_operator_or_field(definition, message):
    errors = validate(definition)
    assert any(e.startswith(message) for e in errors), errors


def test_every_error_is_reported_at_once():
    definition = job(
        Operator("in", "source"),
        Operator("x", "sorcery", upstream=("in",)),
        Operator("out", "sink", upstream=("x",)),
    )
    errors = validate(definition)
    assert "operator 'x': unknown kind 'sorcery'" in errors[0]
    assert any("operator 'x': missing function" in e for e in errors)


def write_module(directory, name, body):
    path = directory / "team" / f"{name}.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(body)
    return path


GOOD_MODULE = """
from spark_runtime.jobdef import JobDefinition, Operator, Upsert

def keep(df):
    return df

job = JobDefinition(
    name="kept",
    input_fields={"user": "string"},
    operators=(
        Operator("in", "source"),
        Operator("keep", "filter", upstream=("in",), function=keep),
        Operator("out", "sink", upstream=("keep",)),
    ),
    output=Upsert(key=("user",)),
)
"""


def test_modules_load_only_from_the_jobs_directory(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    write_module(jobs, "kept", GOOD_MODULE)
    assert load_definition("team.kept:job", jobs).name == "kept"
    with pytest.raises(ValueError, match="expected package.module:attribute"):
        module_path("../outside:job", jobs)
    with pytest.raises(ValueError, match="no file team/missing.py"):
        module_path("team.missing:job", jobs)
    (tmp_path / "elsewhere.py").write_text(GOOD_MODULE)
    with pytest.raises(ValueError, match="expected package.module:attribute"):
        module_path("/tmp/elsewhere:job", jobs)
    write_module(jobs, "bad", GOOD_MODULE.replace('"kept"', '"Bad Name"'))
    with pytest.raises(JobDefinitionError, match="name 'Bad Name'"):
        load_definition("team.bad:job", jobs)


def test_a_registered_version_keeps_its_code_when_the_module_changes(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    module = write_module(jobs, "kept", GOOD_MODULE)
    snapshot = registered_path("kept", 1, jobs)
    snapshot.parent.mkdir(parents=True)
    snapshot.write_text(snapshot_source("team.kept:job", jobs))
    module.write_text(GOOD_MODULE.replace('"filter"', '"map"'))
    topology = resolve_topology("kept@1", jobs)
    assert topology.operator("keep").kind == "filter"
    assert topology.job.name == "kept"
    with pytest.raises(KeyError, match="kept@2"):
        resolve_topology("kept@2", jobs)


def test_a_stateful_operators_parallelism_is_the_whole_chains_so_it_stays_one_stage():
    definition = job(
        Operator("in", "source"),
        Operator("parse", "map", upstream=("in",), function=identity),
        Operator("count", "aggregate", upstream=("parse",), function=identity, parallelism=4),
        Operator("out", "sink", upstream=("count",)),
    )
    assert validate(definition) == []
    assert definition.parallelism == 4
    topology = definition.to_topology(1)
    assert {op.parallelism for op in topology.operators} == {4}
    for rule in (FUSED, PER_STATEFUL, CHAINED):
        (stage,) = compile_stages(topology, rule, job="j")
        assert stage.operators == ("parse", "count")
