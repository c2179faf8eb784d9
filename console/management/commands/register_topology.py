"""`manage.py register_topology package.module:attribute`: register a user job; `manage.py
register_topology --app PATH [--name NAME]`: register an existing app (docs/JOBS.md)."""

from django.core.management.base import BaseCommand, CommandError

from console.services.topologies import RegistrationRefused, register, register_app


class Command(BaseCommand):
    help = (
        "Check a job module from the jobs directory (BACKSTOP_JOBS_DIR) against the contract, "
        "dry-run it on a local Spark session and register it as the next version of its job; "
        "or, with --app, check that an existing app compiles and imports and register it. "
        "With --app the last line printed is the version a job runs: NAME@VERSION."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "module", nargs="?", help="package.module:attribute inside the jobs directory"
        )
        parser.add_argument("--app", help="an existing app's path inside the jobs directory")
        parser.add_argument("--name", help="the app's job name (default: its file's name)")

    def handle(self, *args, **options):
        if bool(options["module"]) == bool(options["app"]):
            raise CommandError("give either a module (package.module:attribute) or --app PATH")
        if options["name"] and not options["app"]:
            raise CommandError("--name names an app: use it with --app")
        try:
            if options["app"]:
                self.stdout.write(f"checking {options['app']} (compiles, imports)...")
                version, created = register_app(options["app"], options["name"])
            else:
                self.stdout.write(
                    f"checking {options['module']} (contract, then a Spark dry run)..."
                )
                version, created = register(options["module"])
        except RegistrationRefused as exc:
            raise CommandError("refused:\n  " + "\n  ".join(exc.errors)) from None
        if created:
            self.stdout.write(self.style.SUCCESS(f"registered {version.ident}"))
        else:
            self.stdout.write(f"unchanged: {version.ident} is the newest version")
        if options["app"]:
            self.stdout.write(version.ident)
