"""`manage.py inject_fault JOB KIND [--operator NAME | --node NAME] [--duration S] [--workers N]
[--clean-stop] [--params JSON] --as USER`"""

import json

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from console.models import FaultInjection, Node
from console.roles import OPERATOR, has_role
from console.services import faults
from console.services.schedules import schedule_drill
from console.services.teams import jobs_visible_to


class Command(BaseCommand):
    help = "Inject a fault into a running job (operator or admin role), or schedule a drill."

    def add_arguments(self, parser):
        parser.add_argument("job", help="job id or name")
        parser.add_argument("kind", choices=FaultInjection.Kind.values)
        parser.add_argument("--operator", default="", help="target operator (stage faults)")
        parser.add_argument("--node", default="", help="target node (node faults)")
        parser.add_argument(
            "--duration", type=float, help="seconds, for pause, stress, slow and kafka-broker"
        )
        parser.add_argument("--workers", type=int, help="CPU hogs, for stress-node")
        parser.add_argument(
            "--clean-stop",
            action="store_true",
            help="kafka-broker: stop the broker with SIGTERM (a clean shutdown), not SIGKILL",
        )
        parser.add_argument(
            "--params",
            default="",
            help="the fault's params as a JSON object, e.g. '{\"workers\": 2}'",
        )
        parser.add_argument("--as", dest="username", required=True, help="who asks (audited)")
        parser.add_argument(
            "--every", type=int, help="schedule a recurring drill every N seconds instead"
        )

    def handle(self, *args, job, kind, operator, node, username, every, **options):
        duration, workers, params = options["duration"], options["workers"], options["params"]
        user = get_user_model().objects.filter(username=username).first()
        if user is None or not has_role(user, OPERATOR):
            raise CommandError(f"--as {username}: only operators and admins may inject faults")
        target_job = (
            # Another team's job is "not found" for the user the command acts for.
            jobs_visible_to(user).filter(pk=int(job)).first()
            if job.isdigit()
            else jobs_visible_to(user).filter(name=job).order_by("-created_at").first()
        )
        if target_job is None:
            raise CommandError(f"job {job!r} not found")
        target_node = None
        if node:
            target_node = Node.objects.filter(name=node).first()
            if target_node is None:
                raise CommandError(f"--node: no node {node!r}")
        if every:
            task = schedule_drill(
                target_job.pk, kind, every, target_operator=operator, target_node=node
            )
            self.stdout.write(f"scheduled {task.name} every {every} s")
            return
        params = self.fault_params(params, duration, workers, options["clean_stop"])
        try:
            fault = faults.request_fault(
                target_job,
                kind,
                target_operator=operator,
                target_node=target_node,
                params=params,
                requested_by=user,
            )
        except faults.FaultRefused as exc:
            raise CommandError(str(exc)) from exc
        fault = faults.inject(fault)
        self.stdout.write(f"fault {fault.pk}: {fault.outcome} ({fault.outcome_detail})")

    @staticmethod
    def fault_params(
        raw: str, duration: float | None, workers: int | None, clean_stop: bool = False
    ):
        """--params JSON with --duration, --workers and --clean-stop on top; the fault service
        checks them."""
        try:
            params = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise CommandError(f"params: --params is not JSON ({exc})") from exc
        if isinstance(params, dict):
            if duration is not None:
                params["duration_s"] = duration
            if workers is not None:
                params["workers"] = workers
            if clean_stop:
                params["hard"] = False
        return params
