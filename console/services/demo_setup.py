"""Demo data that is real, not made up: role users and the nodes of this machine."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import psutil
from django.contrib.auth.models import Group, User
from django.db import transaction

from console.models import Node, Team
from console.roles import ADMIN, OPERATOR, VIEWER
from console.services.teams import DEFAULT_TEAM

DEMO_USERS = (("admin", ADMIN), ("operator", OPERATOR), ("viewer", VIEWER))
DEMO_NODES = ("node-1", "node-2", "node-3")


@transaction.atomic
def ensure_demo_users(password_file: Path) -> dict[str, str]:
    """Create (or reset) admin, operator and viewer with passwords kept in `password_file`.

    Passwords are random on the first run and reused afterwards, so a restarted demo prints the
    same ones. The admin is also a superuser and staff, so it can use the Django admin. All
    three are in the team "default", which owns the demo's jobs.
    """
    team = Team.named(DEFAULT_TEAM)
    passwords = json.loads(password_file.read_text()) if password_file.exists() else {}
    for username, role in DEMO_USERS:
        passwords.setdefault(username, secrets.token_urlsafe(9))
        user, _ = User.objects.get_or_create(username=username)
        user.set_password(passwords[username])
        user.is_staff = role == ADMIN
        user.is_superuser = role == ADMIN
        user.save()
        user.groups.set([Group.objects.get_or_create(name=role)[0], team.group])
    password_file.parent.mkdir(parents=True, exist_ok=True)
    password_file.write_text(json.dumps(passwords, indent=2))
    password_file.chmod(0o600)
    return passwords


def ensure_demo_nodes(names: tuple[str, ...] = DEMO_NODES) -> list[Node]:
    """Register the demo's node agents, splitting this machine's memory between them.

    All demo nodes share this machine's cores, so each is given every core: that is what a
    process on it can use. Memory is split so the policy's reserve means something.
    """
    cores = float(psutil.cpu_count() or 1)
    mem_mb = psutil.virtual_memory().total / 2**20 / len(names)
    nodes = []
    for name in names:
        node, _ = Node.objects.update_or_create(
            name=name, defaults={"cpu_total": cores, "mem_total_mb": round(mem_mb)}
        )
        nodes.append(node)
    return nodes
