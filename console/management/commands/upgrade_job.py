"""`manage.py upgrade_job JOB [--to NAME@V] [--param OP.KEY=VALUE ...] --as USER [--wait S]`,
`manage.py upgrade_job JOB --strategy NAME --as USER`,
`manage.py upgrade_job JOB --confirm | --rollback --as USER`: upgrade a running job blue/green
or change its strategy in place (console.services.upgrades), or end its upgrade under way by
hand."""

import time

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from console.models import JobUpgrade
from console.roles import OPERATOR, has_role
from console.services import upgrades
from console.services.teams import jobs_visible_to


class Command(BaseCommand):
    help = (
        "Upgrade a running job to another version or other operator parameters, blue/green, "
        "or change its strategy in place."
    )

    def add_arguments(self, parser):
        parser.add_argument("job", help="job id or name")
        parser.add_argument("--to", default=None, help="the version to run, e.g. activity@2")
        parser.add_argument(
            "--param", action="append", default=[], help="OPERATOR.KEY=VALUE (repeatable)"
        )
        parser.add_argument(
            "--strategy",
            default=None,
            help="another fault-tolerance strategy (an upgrade of its own, made in place)",
        )
        parser.add_argument(
            "--mode",
            choices=JobUpgrade.Mode.values,
            default=JobUpgrade.Mode.BLUE_GREEN,
            help="blue_green (default) or stop_restart (stop, restart from the checkpoint)",
        )
        parser.add_argument(
            "--result-preserving",
            action="store_true",
            help="the new version computes the same results: the old one checks them while "
            "validating, and a difference rolls the upgrade back",
        )
        parser.add_argument("--as", dest="username", required=True, help="who asks (audited)")
        ends = parser.add_mutually_exclusive_group()
        ends.add_argument("--confirm", action="store_true", help="retire the old version now")
        ends.add_argument("--rollback", action="store_true", help="hand the output back")
        parser.add_argument(
            "--wait",
            type=float,
            default=0.0,
            help="wait up to this many seconds for the upgrade to end, printing each step",
        )

    def handle(
        self,
        *args,
        job,
        to,
        param,
        strategy,
        mode,
        result_preserving,
        username,
        confirm,
        rollback,
        wait,
        **options,
    ):
        user = get_user_model().objects.filter(username=username).first()
        if user is None or not has_role(user, OPERATOR):
            raise CommandError(f"--as {username}: only operators and admins may upgrade jobs")
        target = (
            # Another team's job is "not found" for the user the command acts for.
            jobs_visible_to(user).filter(pk=int(job)).first()
            if job.isdigit()
            else jobs_visible_to(user).filter(name=job).order_by("-created_at").first()
        )
        if target is None:
            raise CommandError(f"job {job!r} not found")
        try:
            if confirm or rollback:
                upgrade = target.upgrades.filter(status__in=JobUpgrade.UNDER_WAY).first()
                if upgrade is None:
                    raise CommandError(f"job {target.name!r} has no upgrade under way")
                action = upgrades.CONFIRM if confirm else upgrades.ROLLBACK
                upgrade = upgrades.request_end(upgrade, action, user)
                self.stdout.write(f"upgrade {upgrade.pk}: {action} asked")
            else:
                params = dict(self.split(item) for item in param) if param else None
                upgrade = upgrades.request_upgrade(
                    target,
                    topology=to,
                    params=params,
                    user=user,
                    mode=mode,
                    strategy=strategy,
                    result_preserving=result_preserving,
                )
                change = (
                    f"strategy {upgrade.from_strategy} -> {upgrade.to_strategy}"
                    if upgrade.changes_strategy
                    else f"{upgrade.from_topology} -> {upgrade.to_topology}"
                )
                self.stdout.write(
                    f"upgrade {upgrade.pk}: {change} requested; the state check runs first"
                )
        except upgrades.UpgradeRequestError as exc:
            raise CommandError(str(exc)) from exc
        if wait > 0:
            self.follow(upgrade, wait)

    @staticmethod
    def split(item: str) -> tuple[str, str]:
        name, sep, value = item.partition("=")
        if not sep:
            raise CommandError(f"--param {item!r}: expected OPERATOR.KEY=VALUE")
        return name, value

    def follow(self, upgrade: JobUpgrade, wait_s: float) -> None:
        """Print each status the upgrade passes through until it ends or `wait_s` passes."""
        deadline, seen = time.monotonic() + wait_s, None
        while time.monotonic() < deadline:
            upgrade.refresh_from_db()
            step = (upgrade.status, upgrade.case)
            if step != seen:
                seen = step
                detail = f" ({upgrade.case}: {upgrade.reason})" if upgrade.case else ""
                self.stdout.write(f"upgrade {upgrade.pk}: {upgrade.status}{detail}")
            if not upgrade.under_way:
                if upgrade.outcome:
                    self.stdout.write(f"upgrade {upgrade.pk}: {upgrade.outcome}")
                return
            time.sleep(1.0)
        raise CommandError(f"upgrade {upgrade.pk} is still {upgrade.status} after {wait_s:g} s")
