"""Registering user jobs (docs/JOBS.md) and resolving the topology a job runs.

The API (`POST /api/topologies/`), the admin and `manage.py register_topology` all go through
`register`. The module is checked in a child process (`python -m spark_runtime.user_plan
check`): a module not yet checked may fail to import, hang or exit, and the dry run needs a
SparkSession, none of which belongs in a web server. A registered version's snapshot is
imported here to read its operators (its top level runs; its functions run only in stages).
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
from spark_runtime.jobdef import (
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
    command = [sys.executable, "-m", "spark_runtime.user_plan", "check", ref]
    command += ["--jobs-dir", str(jobs_dir())]
    env = {**os.environ, "PYTHONPATH": str(settings.BASE_DIR)}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, env=env
        )
    except subprocess.TimeoutExpired:
        return {"errors": [f"module {ref!r}: the check took longer than {CHECK_TIMEOUT_S} s"]}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"errors": [f"module {ref!r}: the check failed: {' | '.join(tail)}"]}
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
