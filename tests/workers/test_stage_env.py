"""Stage processes get the data plane's environment, never the console's secrets (issue 58): a
stage runs users' job code, and SECRET_KEY would let a job forge an admin's session. Read from
the real process the node agent starts (/proc/PID/environ), not from the agent's arguments."""

import os

import pytest
from django.conf import settings

from spark_runtime.stage_env import stage_environment
from tests.proc_environ import environ_of
from tests.workers.agent_children import kill_children_of
from workers import agent
from workers.node import children

NODE = "tn-env"
JOB = "jk-env"
REPLICA = "count-1"
FAKE_STAGE = "tests.workers.sleeping_stage"
SECRETS = {
    "SECRET_KEY": "console-signing-key",
    "DATABASE_URL": "postgres://backstop:pw@db:5432/backstop",
    "EMAIL_URL": "smtp+tls://backstop:pw@smtp.example:587",
    "METRICS_TOKEN": "scrape-token",
}


@pytest.fixture
def stage_agent(monkeypatch, tmp_path, settings):
    """The agent of NODE with the console's secrets in its environment, allowed to start the
    sleeping stand-in of a stage; what it starts is killed afterwards."""
    monkeypatch.setenv("BACKSTOP_NODE", NODE)
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SPARK_LOG_LEVEL", "WARN")
    monkeypatch.setattr(children, "ALLOWED_ENTRY_POINTS", {FAKE_STAGE: None})
    settings.VAR_DIR = tmp_path
    yield agent
    kill_children_of({JOB})


def test_a_stage_started_by_the_agent_has_none_of_the_consoles_secrets(stage_agent):
    args = ["--job", JOB, "--stage", "count", "--role", "primary", "--replica-id", REPLICA,
            "--node", NODE]  # fmt: skip
    # Through the Celery task, as the node's queue delivers it (run here, not on a worker).
    pid = stage_agent.start_replica.apply(args=(FAKE_STAGE, args, REPLICA, JOB)).get()
    seen = environ_of(pid)
    assert not set(SECRETS) & set(seen), sorted(seen)
    assert "DJANGO_SETTINGS_MODULE" not in seen
    # What the data plane needs is there.
    assert seen["REDIS_URL"] == settings.REDIS_URL
    assert seen["PATH"] == os.environ["PATH"]
    assert seen["SPARK_LOG_LEVEL"] == "WARN"
    assert seen["PYSPARK_PYTHON"]


def test_the_allow_list_and_the_operators_additions_never_pass_a_secret():
    parent = {
        **SECRETS,
        "PATH": "/usr/bin",
        "SPARK_HOME": "/opt/spark",
        "LC_ALL": "C.UTF-8",
        "AWS_ACCESS_KEY_ID": "checkpoints-key",
        "GRAFANA_ADMIN_PASSWORD": "g",
        "BACKSTOP_STAGE_ENV": "AWS_ACCESS_KEY_ID, SECRET_KEY,DATABASE_URL",
    }
    built = stage_environment(parent, REDIS_URL="redis://r:6379/0")
    assert built == {
        "PATH": "/usr/bin",
        "SPARK_HOME": "/opt/spark",
        "LC_ALL": "C.UTF-8",
        "AWS_ACCESS_KEY_ID": "checkpoints-key",
        "REDIS_URL": "redis://r:6379/0",
    }
    assert stage_environment({"PATH": "/bin"}, SECRET_KEY="x") == {"PATH": "/bin"}
