# Joins the app operators' kind (0032) with the rest of this session's migrations.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('console', '0032_app_queries'),
        ('console', '0041_merge_app_upgrades'),
    ]

    operations = []
