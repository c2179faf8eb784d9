"""`manage.py register_topology package.module:attribute`: register a user job (docs/JOBS.md)."""

from django.core.management.base import BaseCommand, CommandError

from console.services.topologies import RegistrationRefused, register


class Command(BaseCommand):
    help = (
        "Check a job module from the jobs directory (BACKSTOP_JOBS_DIR) against the contract, "
        "dry-run it on a local Spark session and register it as the next version of its job."
    )

    def add_arguments(self, parser):
        parser.add_argument("module", help="package.module:attribute inside the jobs directory")

    def handle(self, *args, **options):
        self.stdout.write(f"checking {options['module']} (contract, then a Spark dry run)...")
        try:
            version, created = register(options["module"])
        except RegistrationRefused as exc:
            raise CommandError("refused:\n  " + "\n  ".join(exc.errors)) from None
        if created:
            self.stdout.write(self.style.SUCCESS(f"registered {version.ident}"))
        else:
            self.stdout.write(f"unchanged: {version.ident} is the newest version")
