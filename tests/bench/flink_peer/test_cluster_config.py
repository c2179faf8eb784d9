"""The Flink peer's cluster configuration and TaskManager naming (no Flink started here; the
slow test tests/bench/test_bench_flink.py starts a real cluster)."""

import os
import signal
import subprocess
import sys
import time
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


def test_the_live_processes_are_the_sessions_of_its_processes_and_skip_the_gone(tmp_path):
    """What the resource sampler reads: each started process's session (a TaskManager and the
    Python workers it starts), as the processes found, so one killed meanwhile is not looked up
    again (the sampler died on a pid gone between listing and lookup)."""
    cluster = FlinkCluster(fake_env(tmp_path), FlinkSettings(), tmp_path / "run")
    # The leader reaps its child when it is killed, as a TaskManager does its Python workers.
    script = "import subprocess, time; subprocess.Popen(['sleep', '60']).wait(); time.sleep(60)"
    leader = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        cluster.processes["tm-1"] = leader
        deadline = time.time() + 10
        while len(cluster.live_processes()) < 2 and time.time() < deadline:
            time.sleep(0.05)
        found = cluster.live_processes()
        child = next(p for p in found if p.pid != leader.pid)
        assert {p.pid for p in found} == {leader.pid, child.pid}
        child.kill()
        deadline = time.time() + 10
        while len(cluster.live_processes()) > 1 and time.time() < deadline:
            time.sleep(0.05)
        assert [p.pid for p in cluster.live_processes()] == [leader.pid]
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
