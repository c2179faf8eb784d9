"""The Flink peer's profiles and options (issue 46): what each profile sets, what overrides what,
what the cluster and the job get, what bench.json records, and the command line. No Flink is
started here (tests/bench/test_bench_flink.py starts a real cluster)."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from django.core.management.base import CommandError

from bench.flink_peer.cluster import FlinkCluster, flink_config, flink_settings
from bench.flink_peer.peer import job_arguments, peer_record
from bench.management.commands.bench import Command, flink_options
from tests.bench.flink_peer.test_cluster_config import OPTS, fake_env
from tests.bench.test_bench_settings import settings as bench_settings

# flink_config() of FlinkSettings() before the profiles existed (rest port 18081, RPC port
# 16123, data dir DATA): the default profile must give the cluster every one of these.
BEFORE = {
    "env.java.opts.all": OPTS,
    "jobmanager.rpc.address": "localhost",
    "jobmanager.rpc.port": "16123",
    "jobmanager.bind-host": "localhost",
    "jobmanager.memory.process.size": "1024m",
    "jobmanager.execution.failover-strategy": "region",
    "taskmanager.bind-host": "localhost",
    "taskmanager.host": "localhost",
    "taskmanager.numberOfTaskSlots": "1",
    "taskmanager.memory.process.size": "1024m",
    "rest.address": "localhost",
    "rest.bind-address": "localhost",
    "rest.port": "18081",
    "parallelism.default": "1",
    "execution.checkpointing.dir": "DATA/checkpoints",
    "python.executable": "PYTHON",
    "python.client.executable": "PYTHON",
    "python.fn-execution.bundle.time": "100",
    "execution.buffer-timeout.interval": "100 ms",
    "io.tmp.dirs": "DATA/tmp",
}
# Before, the job was given --checkpoint-ms 10000 and its FileSource looked for new files every
# 100 ms (job.py DISCOVERY_MS); heartbeats and restarts were left to Flink 2.3, whose defaults
# (configuration page; "Task Failure Recovery": exponential delay when checkpointing is on) the
# default profile now writes out.
FLINK_DEFAULTS_WRITTEN = {
    "execution.checkpointing.interval": "10000 ms",
    "heartbeat.interval": "10000 ms",
    "heartbeat.timeout": "50000 ms",
    "heartbeat.rpc-failure-threshold": "2",
    "restart-strategy.type": "exponential-delay",
    "restart-strategy.exponential-delay.initial-backoff": "1000 ms",
}


def config_of(tmp_path: Path, settings) -> dict[str, str]:
    env = fake_env(tmp_path)
    config = flink_config(env, settings, rest_port=18081, rpc_port=16123, data_dir=tmp_path)
    # The paths of this test's directory, as BEFORE names them.
    replaced = {
        (tmp_path / "checkpoints").as_uri(): "DATA/checkpoints",
        str(tmp_path / "tmp"): "DATA/tmp",
        str(env.python): "PYTHON",
    }
    return {key: replaced.get(value, value) for key, value in config.items()}


def job_args(settings, config: dict[str, str]) -> dict[str, str]:
    args = job_arguments("wordcount", "wc-1", Path("in"), "redis://x", {}, settings, config)
    return dict(zip(args[::2], args[1::2], strict=True))


def test_the_default_profile_is_what_the_peer_ran_with_before(tmp_path):
    default = flink_settings()
    assert default == flink_settings("default")
    assert default.profile == "default"
    config = config_of(tmp_path, default)
    assert config == {**BEFORE, **FLINK_DEFAULTS_WRITTEN}
    args = job_args(default, config)
    assert (args["--checkpoint-ms"], args["--discovery-ms"]) == ("10000", "100")


def test_the_tuned_profile_checkpoints_often_detects_fast_and_restarts_soon(tmp_path):
    tuned = flink_settings("tuned")
    config = config_of(tmp_path, tuned)
    assert 1000 <= int(config["execution.checkpointing.interval"].removesuffix(" ms")) <= 2000
    assert config["heartbeat.interval"] == "1000 ms"
    assert config["heartbeat.timeout"] == "5000 ms"
    assert config["heartbeat.rpc-failure-threshold"] == "1"
    assert config["restart-strategy.type"] == "fixed-delay"
    assert config["restart-strategy.fixed-delay.delay"] == "500 ms"
    # Flink's own default is 1 attempt: the job would fail at its second restart.
    assert config["restart-strategy.fixed-delay.attempts"] == str(2**31 - 1)
    assert not any(key.startswith("restart-strategy.exponential") for key in config)
    # Everything else as in the default profile.
    assert {key: config[key] for key in BEFORE} == BEFORE
    args = job_args(tuned, config)
    assert args["--checkpoint-ms"] == config["execution.checkpointing.interval"].split()[0]
    assert int(args["--discovery-ms"]) < 100


def test_options_override_the_profile(tmp_path):
    options = (("checkpoint_ms", 2000), ("restart_strategy", "exponential-delay"),
               ("restart_delay_ms", 200), ("bundle_time_ms", 50))  # fmt: skip
    settings = flink_settings("tuned", options)
    config = config_of(tmp_path, settings)
    assert config["execution.checkpointing.interval"] == "2000 ms"
    assert config["restart-strategy.type"] == "exponential-delay"
    assert config["restart-strategy.exponential-delay.initial-backoff"] == "200 ms"
    assert not any(key.startswith("restart-strategy.fixed-delay") for key in config)
    assert config["python.fn-execution.bundle.time"] == "50"
    # The profile's values hold where no option is given.
    assert (config["heartbeat.interval"], config["heartbeat.timeout"]) == ("1000 ms", "5000 ms")
    assert settings.profile == "tuned" and settings.discovery_ms == 50
    assert job_args(settings, config)["--checkpoint-ms"] == "2000"


def test_flink_conf_overrides_the_profile_and_the_options(tmp_path):
    extra = (
        ("heartbeat.timeout", "20 s"),
        ("execution.checkpointing.interval", "3 s"),
        ("restart-strategy.fixed-delay.attempts", "10"),
        ("state.backend.type", "hashmap"),
    )
    settings = flink_settings("tuned", (("heartbeat_timeout_ms", 8000),), extra)
    config = config_of(tmp_path, settings)
    assert config["heartbeat.timeout"] == "20 s"
    assert config["execution.checkpointing.interval"] == "3 s"
    assert config["restart-strategy.fixed-delay.attempts"] == "10"
    assert config["state.backend.type"] == "hashmap"
    # The job checkpoints at the interval the configuration says, not the option's.
    assert job_args(settings, config)["--checkpoint-ms"] == "3000"


def test_the_cluster_gets_the_effective_configuration(tmp_path):
    settings = flink_settings("tuned", (("checkpoint_ms", 1500),), (("heartbeat.timeout", "7 s"),))
    cluster = FlinkCluster(fake_env(tmp_path), settings, tmp_path / "run")
    cluster.write_config()
    written = {}
    for line in (tmp_path / "run/conf/config.yaml").read_text().splitlines():
        key, _, value = line.partition(": ")
        written[key] = json.loads(value)
    assert written == cluster.config
    assert written["execution.checkpointing.interval"] == "1500 ms"
    assert written["heartbeat.timeout"] == "7 s"
    assert written["heartbeat.interval"] == "1000 ms"


def test_the_peer_record_holds_the_profile_and_every_setting(tmp_path):
    settings = flink_settings("tuned", (("checkpoint_ms", 2000),), (("heartbeat.timeout", "6 s"),))
    config = config_of(tmp_path, settings)
    status = {"state": "RUNNING", "failures": ["RecipientUnreachableException"]}
    record = peer_record(
        settings, config, "ab12", status, {"p50": 0.027, "p99": 0.052}, tmp_path / "log"
    )
    record = json.loads(json.dumps(record))  # as bench.json has it
    assert record["flink_profile"] == "tuned"
    assert record["flink_config"] == config
    assert record["flink_settings"] == {
        "parallelism": 1, "spare_taskmanagers": 1, "profile": "tuned", "checkpoint_ms": 2000,
        "heartbeat_interval_ms": 1000, "heartbeat_timeout_ms": 5000,
        "heartbeat_rpc_failure_threshold": 1, "restart_strategy": "fixed-delay",
        "restart_delay_ms": 500, "discovery_ms": 50, "bundle_time_ms": 100,
        "buffer_timeout_ms": 100, "taskmanager_memory": "1024m", "jobmanager_memory": "1024m",
    }  # fmt: skip
    assert record["extra_conf"] == {"heartbeat.timeout": "6 s"}
    assert (record["checkpoint_ms"], record["file_discovery_ms"]) == (2000, 50)
    # What the report's "Backstop vs Flink" line reads is still there.
    assert (record["taskmanagers"], record["bundle_time_ms"], record["buffer_timeout_ms"]) == (
        2, 100, 100)  # fmt: skip
    assert (record["bridge_p50_ms"], record["bridge_p99_ms"]) == (27.0, 52.0)
    assert record["failures"] == ["RecipientUnreachableException"]


def test_bench_json_settings_record_the_profile_and_the_options():
    bench = bench_settings(peer="flink", flink_profile="tuned",
                           flink_options=(("checkpoint_ms", 2000),),
                           peer_conf=(("heartbeat.timeout", "6 s"),))  # fmt: skip
    recorded = json.loads(json.dumps({k: v for k, v in asdict(bench).items() if k != "out"}))
    assert recorded["flink_profile"] == "tuned"
    assert recorded["flink_options"] == [["checkpoint_ms", 2000]]
    assert recorded["peer_conf"] == [["heartbeat.timeout", "6 s"]]
    assert bench.flink == flink_settings(
        "tuned", (("checkpoint_ms", 2000),), (("heartbeat.timeout", "6 s"),)
    )
    assert bench_settings(peer="flink").flink == flink_settings("default")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"flink_profile": "tuned"}, "--flink-profile: only with --peer flink"),
        ({"flink_options": (("checkpoint_ms", 2000),)}, "--flink-checkpoint-ms: only with --peer"),
        ({"peer": "flink", "flink_profile": "fast"}, "--flink-profile: one of default, tuned"),
        ({"peer": "flink", "flink_options": (("checkpoint_ms", 5),)},
         "--flink-checkpoint-ms: at least 10"),
        ({"peer": "flink", "flink_options": (("heartbeat_timeout_ms", 500),)},
         "--flink-heartbeat-timeout-ms: at least --flink-heartbeat-interval-ms"),
        ({"peer": "flink", "flink_options": (("heartbeat_rpc_failure_threshold", 0),)},
         "--flink-heartbeat-rpc-failure-threshold: -1"),
        ({"peer": "flink", "flink_options": (("restart_strategy", "failure-rate"),)},
         "--flink-restart-strategy: one of exponential-delay, fixed-delay"),
        ({"peer": "flink", "peer_conf": (("execution.checkpointing.interval", "soon"),)},
         "--flink-conf execution.checkpointing.interval: not a Flink duration"),
    ],
)  # fmt: skip
def test_bad_flink_settings_are_refused_naming_the_option(changes, message):
    with pytest.raises(ValueError, match=message):
        bench_settings(**changes)


def parse(*argv: str) -> dict:
    return vars(Command().create_parser("manage.py", "bench").parse_args(list(argv)))


def test_the_command_line_sets_the_profile_and_the_options():
    opts = parse("--peer", "flink")
    assert opts["flink_profile"] == "default" and flink_options(opts) == ()
    opts = parse("--peer", "flink", "--flink-profile", "tuned", "--flink-checkpoint-ms", "2000",
                 "--flink-restart-strategy", "exponential-delay",
                 "--flink-heartbeat-rpc-failure-threshold", "-1")  # fmt: skip
    assert opts["flink_profile"] == "tuned"
    assert flink_options(opts) == (
        ("checkpoint_ms", 2000),
        ("heartbeat_rpc_failure_threshold", -1),
        ("restart_strategy", "exponential-delay"),
    )


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (("--flink-profile", "nonsense"), "--flink-profile"),
        (("--flink-restart-strategy", "sometimes"), "--flink-restart-strategy"),
        (("--flink-heartbeat-timeout-ms", "5s"), "--flink-heartbeat-timeout-ms"),
    ],
)
def test_the_command_line_refuses_a_bad_flink_value_naming_the_option(argv, option):
    with pytest.raises(CommandError, match=option):
        parse("--peer", "flink", *argv)
