from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0031_registered_apps"),
    ]

    operations = [
        migrations.AddField(
            model_name="recoveryepisode",
            name="phases",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
