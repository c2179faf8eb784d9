"""`manage.py policy_explain`: show what the policy would do for a topology on a given cluster.

A dry run: nothing is started, stored or changed. The computation lives in
`console.policy.explain` (no Django); this command reads the files, picks the policy in force
and prints the result.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from console.policy.config import PolicyConfig, PolicyConfigError
from console.policy.explain import explain, format_table, parse_nodes, parse_operators
from spark_runtime.topology import get_topology


def _read_json(path: str, label: str) -> object:
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise CommandError(f"{label} file {path}: cannot read it ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise CommandError(f"{label} file {path}: not valid JSON ({exc})") from exc


def _policy_config(use_defaults: bool) -> tuple[PolicyConfig, str]:
    """The config in force, and where it came from."""
    if use_defaults:
        return PolicyConfig(), "defaults (--defaults)"
    # The Policy model may not exist yet while the app is being built; only that case falls
    # back to defaults. Errors inside current()/to_config() must surface, so they stay outside.
    try:
        from console.models import Policy

        current = Policy.current
    except (ImportError, AttributeError):
        return PolicyConfig(), "defaults (console.models.Policy is not available)"
    policy = current()
    return policy.to_config(), f"policy version {getattr(policy, 'version', '?')}"


class Command(BaseCommand):
    help = (
        "Dry run of the fault-tolerance policy: per operator S, R, L, P, mode, standby node and "
        "checkpoint interval, and each node's Q."
    )

    def add_arguments(self, parser):
        parser.add_argument("--topology", required=True, help="topology name, e.g. wordcount")
        parser.add_argument(
            "--nodes", required=True, help="JSON file: list of node samples (docs/POLICY.md)"
        )
        parser.add_argument(
            "--operators", help="JSON file: operator -> {cpu, mem} demand overrides"
        )
        parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
        parser.add_argument(
            "--defaults", action="store_true", help="use PolicyConfig defaults, not the DB policy"
        )

    def handle(self, *args, **options):
        try:
            topology = get_topology(options["topology"])
        except KeyError as exc:
            raise CommandError(str(exc.args[0])) from exc

        nodes_path = options["nodes"]
        try:
            nodes = parse_nodes(_read_json(nodes_path, "nodes"))
        except ValueError as exc:
            raise CommandError(f"nodes file {nodes_path}: {exc}") from exc

        demands = {}
        if options["operators"]:
            ops_path = options["operators"]
            try:
                demands = parse_operators(_read_json(ops_path, "operators"), topology)
            except ValueError as exc:
                raise CommandError(f"operators file {ops_path}: {exc}") from exc

        config, source = _policy_config(options["defaults"])
        try:
            config.validate()
        except PolicyConfigError as exc:
            raise CommandError(f"policy ({source}) is invalid: {exc}") from exc

        try:
            report = explain(topology, nodes, config, demands)
        except ValueError as exc:
            # e.g. a cluster whose cpu or memory totals add up to zero.
            raise CommandError(f"nodes file {nodes_path}: {exc}") from exc
        report["policy"] = source

        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
        else:
            self.stdout.write(f"policy: {source}")
            self.stdout.write(format_table(report))
