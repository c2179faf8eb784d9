# Joins the recovery phases (0037) with the rest of this session's migrations.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('console', '0037_recovery_phases'),
        ('console', '0039_hold_host_reserve'),
    ]

    operations = []
