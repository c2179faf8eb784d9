from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0013_recovery_episode_watched"),
    ]

    operations = [
        migrations.AddField(
            model_name="replica",
            name="placement",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
