"""The console behind its production server: gunicorn with web/gunicorn.conf.py (as the demo, the
image, compose and docker/k8s run it), static files collected and served by WhiteNoise.

- pages link the static files by hashed names, served compressed with a one-year immutable
  cache header;
- the job page's refresh is computed once for two viewers, whichever of the worker processes
  answers each request (the shared data lives in Redis, not in a worker);
- a worker that dies is replaced by gunicorn's master.
"""

from __future__ import annotations

import gzip
import http.client
import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from bench.loadtest import log_in
from bench.management.commands.loadtest import DASH_TARGET, console_targets
from console.management.commands.demo import Command as Demo
from console.roles import VIEWER
from tests.cluster import database_url
from tests.factories import UserFactory, make_job

ROOT = Path(__file__).resolve().parents[2]
GUNICORN = Path(sys.executable).with_name("gunicorn")
WORKERS = 2

pytestmark = pytest.mark.django_db(transaction=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(port: int, path: str, headers: dict | None = None) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", path, headers=headers or {})
    response = connection.getresponse()
    response.body = response.read()
    connection.close()
    return response


@pytest.fixture(scope="module")
def server(tmp_path_factory, django_db_setup):
    """gunicorn on a free port with the local settings, the test database and Redis, and the
    static files collected into a var directory of the module's own."""
    tmp_path = tmp_path_factory.mktemp("web")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "web.settings.local",
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "BACKSTOP_VAR_DIR": str(tmp_path),
        "WEB_CONCURRENCY": str(WORKERS),
        "DEBUG": "0",
    }
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=300,
    )
    port = free_port()
    log = (tmp_path / "gunicorn.log").open("wb")
    process = subprocess.Popen(
        [str(GUNICORN), "-c", "web/gunicorn.conf.py", "--bind", f"127.0.0.1:{port}",
         "web.wsgi:application"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if get(port, "/accounts/login/").status == 200:
                    break
            except OSError:
                pass
            assert process.poll() is None, (tmp_path / "gunicorn.log").read_text()
            assert time.monotonic() < deadline, "gunicorn did not answer within 60 s"
            time.sleep(0.2)
        yield process, port
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def workers_of(process) -> list[psutil.Process]:
    return psutil.Process(process.pid).children()


def test_static_files_have_hashed_names_and_long_cache_headers(server):
    _, port = server
    page = get(port, "/accounts/login/").body.decode()
    css = re.search(r'href="(/static/backstop\.[0-9a-f]{12}\.css)"', page)
    assert css, "the login page links the stylesheet by its hashed name"
    served = get(port, css[1], {"Accept-Encoding": "gzip"})
    assert served.status == 200
    assert "max-age=315360000" in served.getheader("Cache-Control")
    assert "immutable" in served.getheader("Cache-Control")
    assert served.getheader("Content-Encoding") == "gzip"
    assert gzip.decompress(served.body) == (ROOT / "static" / "backstop.css").read_bytes()


def test_viewers_on_different_workers_share_one_computation(server):
    process, port = server
    assert len(workers_of(process)) == WORKERS
    job = make_job(status="running")
    for name in ("wall-screen", "engineer"):
        user = UserFactory(username=name, role=VIEWER)
        # The server runs the local settings, whose hashers do not include the tests' fast one.
        user.password = PBKDF2PasswordHasher().encode("view-pw-1", "salt-of-" + name, 1000)
        user.save()
    stamps = set()
    for name in ("wall-screen", "engineer"):
        target = next(
            t
            for t in console_targets(job.pk, log_in(f"http://127.0.0.1:{port}", name, "view-pw-1"))
            if t.name == DASH_TARGET
        )
        # New connections, so the master hands them to either worker.
        for _ in range(6):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request(target.method, target.path, body=target.body, headers=target.headers)
            response = connection.getresponse()
            response.read()
            assert response.status == 200
            stamps.add(response.getheader("X-Data-Computed-At"))
            connection.close()
    # 12 refreshes by two viewers, well within 2 s of each other: one computation (at most two
    # if the interval ran out in between), not one per worker or per viewer.
    assert 1 <= len(stamps) <= 2


def test_the_demo_serves_with_gunicorn_and_with_runserver_only_under_debug(settings, tmp_path):
    settings.STATIC_ROOT = tmp_path / "static"
    command = Demo(stdout=io.StringIO())
    settings.DEBUG = False
    argv = command.web_server_argv("127.0.0.1", 8123)
    assert Path(argv[0]).name == "gunicorn"
    assert argv[1:] == ["-c", str(ROOT / "web" / "gunicorn.conf.py"), "--bind", "127.0.0.1:8123",
                        "web.wsgi:application"]  # fmt: skip
    assert (tmp_path / "static" / "backstop.css").exists()  # collected first
    settings.DEBUG = True
    argv = command.web_server_argv("127.0.0.1", 8123)
    assert argv[1:] == ["manage.py", "runserver", "127.0.0.1:8123", "--noreload"]


def test_a_dead_worker_is_replaced(server):
    process, port = server
    victim = workers_of(process)[0]
    victim.kill()
    victim.wait(timeout=10)
    deadline = time.monotonic() + 30
    while len([w for w in workers_of(process) if w.pid != victim.pid]) < WORKERS:
        assert time.monotonic() < deadline, "gunicorn did not replace the worker"
        time.sleep(0.2)
    assert get(port, "/accounts/login/").status == 200
