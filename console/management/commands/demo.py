"""`manage.py demo`: migrate, create demo users and nodes, start Redis and a Kafka broker (if
needed), the Celery controller, the alerts worker, node agents and beat, and the web server;
run a live job on a Kafka topic; print the URL and the logins."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import BaseCommand

from console.models import Job, Team
from console.services.demo_setup import DEMO_NODES, ensure_demo_nodes, ensure_demo_users
from console.services.jobs import create_job, kill_job_processes, kill_warm_spares
from console.services.teams import DEFAULT_TEAM
from console.services.topologies import RegistrationRefused
from console.services.topologies import register as register_topology
from infra.launcher import (
    LocalCluster,
    ProcessGroup,
    http_ok,
    start_kafka_if_needed,
    start_redis_if_needed,
    wait_for,
)
from infra.web_server import thread_count, worker_count
from spark_runtime.strategies import CONSOLE_NICE


def stop_demo_jobs() -> int:
    """End the processes of this database's jobs and mark live jobs stopped.

    Stage processes run in sessions of their own (an agent restart must not take a job down), so
    stopping the demo's Celery processes leaves them running; the demo owns them, so it ends them.
    """
    ended = kill_job_processes(set(Job.objects.values_list("key", flat=True)))
    ended += kill_warm_spares(settings.REDIS_URL)
    for job in Job.objects.filter(status__in=Job.LIVE_STATUSES):
        job.request_stop("demo stopped")
        job.mark_stopped("demo stopped")
    return ended


EXAMPLE_JOB = "examples.clickstream:activity"
# The demo job's Kafka topics: the generator writes the lines, the counts come out exactly once.
DEMO_SOURCE = {"kind": "kafka", "topic": "demo-lines", "starting_offsets": "latest"}
DEMO_SINK = {"kind": "kafka", "topic": "demo-counts"}


def debug_note(debug: bool) -> str:
    """How DEBUG is set for this run, and how to change it."""
    if debug:
        return (
            "  DEBUG is on (DEBUG=1): error pages show tracebacks and settings to every "
            "logged-in user; unset DEBUG before anyone else uses this console."
        )
    return (
        "  DEBUG is off: errors show short pages, details go to the logs. For development, "
        "run with DEBUG=1 (e.g. `DEBUG=1 bin/demo`) to get Django's debug pages."
    )


class Command(BaseCommand):
    help = "Run the Backstop demo console on this machine (Ctrl-C stops everything)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--check", action="store_true", help="Start, verify /healthz, then stop (smoke test)."
        )

    def ensure_demo_job(self):
        """The live demo job: a running one, else a new wordcount job under the adaptive policy
        reading the Kafka topic `demo-lines` from its end and writing `demo-counts`."""
        live = Job.objects.filter(name="demo-wordcount", status__in=Job.LIVE_STATUSES).first()
        if live is not None:
            return live
        return create_job(
            name="demo-wordcount",
            topology="wordcount",
            strategy=Job.Strategy.ADAPTIVE,
            params={"rate": 50},
            user=User.objects.get(username="operator"),
            source=DEMO_SOURCE,
            sink=DEMO_SINK,
            team=Team.named(DEFAULT_TEAM),
        )

    def web_server_argv(self, host: str, port: int) -> list[str]:
        """gunicorn with the production settings file (web/gunicorn.conf.py); Django's
        development server only with DEBUG=1, which also serves the static files itself."""
        if settings.DEBUG:
            self.stdout.write("      Django's runserver (DEBUG=1: development only)")
            return [sys.executable, "manage.py", "runserver", f"{host}:{port}", "--noreload"]
        call_command("collectstatic", interactive=False, verbosity=0)
        self.stdout.write(f"      static files collected into {settings.STATIC_ROOT}")
        config = settings.BASE_DIR / "web" / "gunicorn.conf.py"
        gunicorn = Path(sys.executable).with_name("gunicorn")
        argv = [str(gunicorn), "-c", str(config), "--bind", f"{host}:{port}"]
        self.stdout.write(
            f"      gunicorn: {worker_count()} workers x {thread_count()} threads"
            " (web/gunicorn.conf.py; WEB_CONCURRENCY changes the workers)"
        )
        return [*argv, "web.wsgi:application"]

    def step(self, number: int, total: int, text: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(f"[{number}/{total}] {text}"))

    def handle(self, *args, host, port, check, **options):
        total = 8
        log_dir = settings.VAR_DIR / "log"
        group = ProcessGroup(log_dir, say=lambda message: self.stderr.write(message))
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            self.step(1, total, "database migrations")
            call_command("migrate", interactive=False, verbosity=0)

            self.step(2, total, "demo users and nodes")
            passwords = ensure_demo_users(settings.VAR_DIR / "demo-passwords.json")
            nodes = ensure_demo_nodes()
            self.stdout.write(f"      nodes: {', '.join(n.name for n in nodes)}")

            self.step(3, total, "Redis and Kafka")
            self.stdout.write(
                "      "
                + start_redis_if_needed(settings.REDIS_URL, group, settings.VAR_DIR / "redis")
            )
            # Kept by this process (registered in Redis): the kafka-broker fault stops it.
            bootstrap = start_kafka_if_needed(
                group, settings.VAR_DIR / "kafka-broker", redis_url=settings.REDIS_URL
            )
            # Every process started from here on (controller, agents, web) uses this cluster.
            os.environ["KAFKA_BOOTSTRAP_SERVERS"] = settings.KAFKA_BOOTSTRAP_SERVERS = bootstrap
            self.stdout.write(f"      Kafka at {bootstrap} (KAFKA_BOOTSTRAP_SERVERS)")

            self.step(4, total, "Celery: controller, alerts worker, node agents, beat")
            LocalCluster(
                group,
                DEMO_NODES,
                node_mem_mb=nodes[0].mem_total_mb,
                beat_schedule=settings.VAR_DIR / "beat.db",
            ).start(settings.REDIS_URL)

            self.step(5, total, f"web server on http://{host}:{port}/")
            group.start("web", self.web_server_argv(host, port), nice=CONSOLE_NICE)
            base_url = f"http://{host}:{port}"
            wait_for(
                lambda: http_ok(f"{base_url}/healthz"),
                90,
                "/healthz to report database, Redis and Celery up (see var/log/)",
            )

            self.step(6, total, "live demo job (wordcount on Kafka, adaptive, 50 lines/s)")
            job = self.ensure_demo_job()
            wait_for(
                lambda: job.__class__.objects.get(pk=job.pk).status == "running",
                240,
                f"demo job {job.pk} to run (first start: Spark takes a minute; see var/log/)",
                poll_s=2,
            )
            self.stdout.write(f"      job {job.pk} running: {base_url}/console/jobs/{job.pk}/")
            self.stdout.write(
                f"      reads Kafka topic {DEMO_SOURCE['topic']}, writes {DEMO_SINK['topic']}"
            )

            self.step(7, total, f"example user job {EXAMPLE_JOB} (docs/JOBS.md)")
            try:
                version, _ = register_topology(EXAMPLE_JOB)
                self.stdout.write(f"      registered as {version.ident}: start it from the console")
            except RegistrationRefused as exc:
                self.stderr.write(f"      not registered: {'; '.join(exc.errors)}")

            self.step(8, total, "ready")
            self.stdout.write(self.style.SUCCESS(f"\n  Backstop console: {base_url}/"))
            self.stdout.write(f"  API docs:         {base_url}/api/docs/")
            self.stdout.write(f"  Admin:            {base_url}/admin/")
            self.stdout.write(f"  Health:           {base_url}/healthz")
            self.stdout.write("  Logins (also in var/demo-passwords.json):")
            for username, password in passwords.items():
                self.stdout.write(f"    {username:9} {password}")
            self.stdout.write(f"  Logs: {log_dir}/   Stop with Ctrl-C.")
            self.stdout.write(debug_note(settings.DEBUG) + "\n")
            if check:
                return
            while True:  # the group restarts a process that exits (see var/log/launcher.log)
                time.sleep(2)
        except KeyboardInterrupt:
            self.stdout.write("\nstopping ...")
        finally:
            group.stop()
            stopped = stop_demo_jobs()
            if stopped:
                self.stdout.write(f"stopped {stopped} stage and generator processes")
