# Joins the app upgrades' case (0034) with the rest of this session's migrations.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('console', '0034_app_upgrades'),
        ('console', '0040_merge_recovery_phases'),
    ]

    operations = []
