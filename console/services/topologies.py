"""Registering user jobs and existing apps (docs/JOBS.md) and resolving the topology a job runs.

The API (`POST /api/topologies/`), the admin and `manage.py register_topology` all go through
`register`. The module is checked in a child process (`python -m spark_runtime.user_plan
check`): a module not yet checked may fail to import, hang or exit, and the dry run needs a
SparkSession, none of which belongs in a web server. A registered version's snapshot is
imported here to read its operators (its top level runs; its functions run only in stages).
An existing app goes through `register_app`, checked in a child process too (`python -m
spark_runtime.apps check`): it must compile and what it imports must import; it is not run, and
its snapshot is only read here, never imported.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction

from console.models import RegisteredTopology
from console.services import audit_log
from spark_runtime import apps
from spark_runtime.jobdef import (
    NAME_PATTERN,
    is_registered_ident,
    jobs_dir,
    registered_path,
    resolve_topology,
    snapshot_source,
)
from spark_runtime.topology import TOPOLOGIES, Topology

CHECK_TIMEOUT_S = 300  # a JVM and a SparkSession on a busy 2-core machine


class RegistrationRefused(Exception):
    """The module breaks the contract or fails its dry run; `errors` lists why."""

    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors


def check_module(ref: str) -> dict:
    """The contract check and dry run of `ref`, in a child process; returns its report."""
    return run_check("spark_runtime.user_plan", ref, f"module {ref!r}")


def run_check(program: str, target: str, what: str) -> dict:
    """`python -m PROGRAM check TARGET --jobs-dir DIR` in a child process; its JSON report, or
    one error naming `what` when it timed out or printed none."""
    command = [sys.executable, "-m", program, "check", target, "--jobs-dir", str(jobs_dir())]
    env = {**os.environ, "PYTHONPATH": str(settings.BASE_DIR)}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, env=env
        )
    except subprocess.TimeoutExpired:
        return {"errors": [f"{what}: the check took longer than {CHECK_TIMEOUT_S} s"]}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"errors": [f"{what}: the check failed: {' | '.join(tail)}"]}
    return json.loads(lines[-1])


def register(ref: str, user=None) -> tuple[RegisteredTopology, bool]:
    """Check `ref` (`package.module:attribute` in the jobs directory) and register it as the
    next version of its job; returns `(version, created)`. Registering an unchanged module again
    returns its current version (`created` False). Raises RegistrationRefused."""
    try:
        source = snapshot_source(ref)
    except ValueError as exc:
        raise RegistrationRefused([str(exc)]) from None
    digest = hashlib.sha256(source.encode()).hexdigest()
    unchanged = RegisteredTopology.objects.filter(module=ref, source_sha256=digest)
    unchanged = unchanged.order_by("-version").first()
    if unchanged is not None and is_newest(unchanged):
        write_snapshot(unchanged)  # checked when it was registered
        return unchanged, False
    report = check_module(ref)
    if report["errors"]:
        raise RegistrationRefused(report["errors"])
    name = report["name"]
    latest = RegisteredTopology.objects.filter(name=name).order_by("-version").first()
    if latest is not None and latest.app:
        raise RegistrationRefused([f"{name}: the name of a registered app; rename the job"])
    shape = {key: report[key] for key in ("operators", "input_fields", "output", "columns")}
    shape["output_mode"] = report["output_mode"]
    shape["has_generator"] = report["has_generator"]
    shape["has_reference"] = report["has_reference"]
    try:
        with transaction.atomic():
            version = RegisteredTopology.objects.create(
                name=name,
                version=(latest.version if latest else 0) + 1,
                module=ref,
                source=source,
                source_sha256=digest,
                description=report.get("description", "")[:300],
                shape=shape,
                registered_by=user if getattr(user, "is_authenticated", False) else None,
            )
    except IntegrityError:
        # Another registration of the same job took this version number first.
        raise RegistrationRefused([f"{name}: registered concurrently; try again"]) from None
    write_snapshot(version)
    audit_log.record(
        "topology.register",
        actor=user,
        target=f"topology:{version.ident}",
        detail={"module": ref, "sha256": digest},
    )
    return version, True


def check_app(path: str) -> dict:
    """The registration check of the app at `path` (compiles, imports), in a child process:
    importing what the app imports runs those packages' top level."""
    return run_check("spark_runtime.apps", path, f"app {path!r}")


def app_name(path: str, name: str | None) -> str:
    """The name an app registers under: `name`, else its file's name; RegistrationRefused
    naming `name` when it is not a job name."""
    chosen = name if name else Path(path).stem.lower().replace("-", "_")
    if not NAME_PATTERN.match(chosen or ""):
        raise RegistrationRefused(
            [f"name: {chosen!r} is not a job name (a lowercase letter, then at most 31 "
             "lowercase letters, digits or underscores); give one with name"]
        )  # fmt: skip
    return chosen


def register_app(path: str, name: str | None = None, user=None) -> tuple[RegisteredTopology, bool]:
    """Check the existing app at `path` (inside the jobs directory) and register it as the next
    version of job `name` (default: the file's name); returns `(version, created)`. The app is
    not started: it must compile, and what it imports must import, each failure naming the
    app's line. Registering an unchanged app again returns its current version. Raises
    RegistrationRefused."""
    try:
        relative = apps.relative_path(path, jobs_dir())
        source = apps.snapshot_text(path, jobs_dir())
    except apps.AppError as exc:
        raise RegistrationRefused([str(exc)]) from None
    name = app_name(relative, name)
    versions = RegisteredTopology.objects.filter(name=name).order_by("-version")
    latest = versions.first()
    if latest is not None and not latest.app:
        raise RegistrationRefused(
            [f"name: {name!r} is a registered job module's; give the app another name"]
        )
    digest = hashlib.sha256(source.encode()).hexdigest()
    if latest is not None and latest.source_sha256 == digest:
        write_snapshot(latest)  # checked when it was registered
        return latest, False
    report = check_app(relative)
    if report["errors"]:
        raise RegistrationRefused(report["errors"])
    try:
        with transaction.atomic():
            version = RegisteredTopology.objects.create(
                name=name,
                version=(latest.version if latest else 0) + 1,
                app=relative,
                source=source,
                source_sha256=digest,
                description=f"the streaming app {relative}, run as it is",
                shape={"app": relative, "operators": [apps.APP_OPERATOR]},
                registered_by=user if getattr(user, "is_authenticated", False) else None,
            )
    except IntegrityError:
        raise RegistrationRefused([f"{name}: registered concurrently; try again"]) from None
    write_snapshot(version)
    audit_log.record(
        "topology.register",
        actor=user,
        target=f"topology:{version.ident}",
        detail={"app": relative, "sha256": digest},
    )
    return version, True


def is_newest(version: RegisteredTopology) -> bool:
    """True if no later version of the same job exists."""
    return not RegisteredTopology.objects.filter(
        name=version.name, version__gt=version.version
    ).exists()


def write_snapshot(version: RegisteredTopology) -> Path:
    """Write (idempotently) the snapshot the stage processes import for `version`."""
    path = registered_path(version.name, version.version)
    if path.is_file() and path.read_text() == version.source:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(version.source)
    partial.replace(path)
    return path


def job_topology(name: str) -> tuple[str, Topology]:
    """What a new job asked to run `name` runs: `(topology name to store, Topology)`.

    `name` is a built-in topology, a registered job (its newest version) or `NAME@VERSION`.
    Raises KeyError naming what is known.
    """
    if name in TOPOLOGIES:
        return name, TOPOLOGIES[name]
    versions = RegisteredTopology.objects.all()
    if is_registered_ident(name):
        job, _, number = name.partition("@")
        version = versions.filter(name=job, version=int(number) if number.isdigit() else -1)
        version = version.first()
    else:
        version = versions.filter(name=name).order_by("-version").first()
    if version is None:
        known = sorted(TOPOLOGIES) + sorted(set(versions.values_list("name", flat=True)))
        raise KeyError(f"unknown topology {name!r}; known: {known}")
    write_snapshot(version)
    return version.ident, resolve_topology(version.ident)


def topology_names() -> list[str]:
    """What the start-job controls offer: the built-in topologies, then registered jobs."""
    registered = RegisteredTopology.objects.order_by("name").values_list("name", flat=True)
    return sorted(TOPOLOGIES) + list(dict.fromkeys(registered))
