from django.db import migrations, models
from django.db.models import F, Q

# What the console waited for before it stopped watching an unrecovered fault.
GIVE_UP_AFTER_S = 600.0


def close_measured_episodes(apps, schema_editor):
    """Episodes measured before this field existed: a recovered one was watched until its
    recovery; one given up on ("not back to normal") for the give-up time."""
    episode = apps.get_model("console", "RecoveryEpisode")
    episode.objects.filter(recovery_time_s__isnull=False).update(watched_s=F("recovery_time_s"))
    episode.objects.filter(
        Q(recovery_time_s__isnull=True) & Q(notes__contains="not back to normal")
    ).update(watched_s=GIVE_UP_AFTER_S)


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0012_checkpoint_interval_in_force"),
    ]

    operations = [
        migrations.AddField(
            model_name="recoveryepisode",
            name="watched_s",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="recoveryepisode",
            name="reference_from",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="recoveryepisode",
            name="reference_to",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(close_measured_episodes, migrations.RunPython.noop),
    ]
