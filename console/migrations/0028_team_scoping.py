"""Put every existing job and every user with a role in the team "default", so scoping jobs by
team (console.services.teams) changes nothing for an existing installation, and let a report
subscription cover a team's jobs. Reversing leaves the team and its members in place: they are
harmless without the scoping."""

import django.db.models.deletion
from django.db import migrations, models

ROLES = ("viewer", "operator", "admin")
DEFAULT_TEAM = "default"
TEAM_GROUP_PREFIX = "team:"


def default_team(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Team = apps.get_model("console", "Team")
    Job = apps.get_model("console", "Job")
    User = apps.get_model("auth", "User")
    group, _ = Group.objects.get_or_create(name=f"{TEAM_GROUP_PREFIX}{DEFAULT_TEAM}")
    team, _ = Team.objects.get_or_create(name=DEFAULT_TEAM, defaults={"group": group})
    Job.objects.filter(team__isnull=True).update(team=team)
    members = User.objects.filter(groups__name__in=ROLES).distinct()
    team.group.user_set.add(*members)


class Migration(migrations.Migration):
    dependencies = [("console", "0027_teams_audit")]

    operations = [
        migrations.AddField(
            model_name="reportsubscription",
            name="team",
            field=models.ForeignKey(
                blank=True,
                help_text="Used when scope is a team's jobs.",
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="report_subscriptions",
                to="console.team",
            ),
        ),
        migrations.AlterField(
            model_name="reportsubscription",
            name="scope",
            field=models.CharField(
                choices=[("all", "all jobs"), ("selected", "selected jobs"), ("team", "a team's jobs")],
                default="all",
                max_length=10,
            ),
        ),
        migrations.RunPython(default_team, migrations.RunPython.noop),
    ]
