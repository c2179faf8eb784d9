"""The Flink peer's cluster configuration and TaskManager naming (no Flink started here; the
slow test tests/bench/test_bench_flink.py starts a real cluster)."""

from pathlib import Path

from bench.flink_peer.cluster import (
    FlinkCluster,
    FlinkSettings,
    flink_config,
    replacement_name,
    shipped_java_opts,
)
from bench.flink_peer.env import FlinkEnv

OPTS = "--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED --add-opens=java.base/java.net=ALL"


def fake_env(tmp_path: Path) -> FlinkEnv:
    env = FlinkEnv(tmp_path / "venv")
    conf = env.flink_home / "conf"
    conf.mkdir(parents=True)
    (conf / "config.yaml").write_text(f"env:\n  java:\n    opts:\n      all: {OPTS}\n")
    return env


def test_config_keeps_the_shipped_jvm_options_and_sets_the_run(tmp_path):
    env = fake_env(tmp_path)
    assert shipped_java_opts(env.flink_home) == OPTS
    settings = FlinkSettings(parallelism=2, checkpoint_ms=5000)
    config = flink_config(env, settings, rest_port=18081, rpc_port=16123, data_dir=tmp_path)
    assert config["env.java.opts.all"] == OPTS
    assert config["rest.port"] == "18081" and config["jobmanager.rpc.port"] == "16123"
    assert config["taskmanager.numberOfTaskSlots"] == "1"
    assert config["parallelism.default"] == "2"
    assert config["execution.checkpointing.dir"] == (tmp_path / "checkpoints").as_uri()
    assert config["python.executable"] == str(env.python)
    assert config["python.fn-execution.bundle.time"] == "100"
    # One slot per TaskManager: the job's, plus a spare for the job to move to.
    assert settings.taskmanagers == 3


def test_a_replaced_taskmanager_gets_a_new_resource_id():
    assert replacement_name("tm-1", ["tm-1", "tm-2"]) == "tm-1-r1"
    assert replacement_name("tm-1-r1", ["tm-1", "tm-2", "tm-1-r1"]) == "tm-1-r2"
    assert replacement_name("tm-2", ["tm-1", "tm-2", "tm-1-r1"]) == "tm-2-r1"


def test_a_relative_run_directory_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cluster = FlinkCluster(fake_env(tmp_path), FlinkSettings(), Path("var/bench/flink"))
    assert cluster.run_dir == tmp_path / "var" / "bench" / "flink"
    cluster.write_config()  # the checkpoint directory is a file URI
    assert (tmp_path / "var/bench/flink/conf/config.yaml").read_text().count("file:///") == 1
