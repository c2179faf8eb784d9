# Written by hand: the policy's hold_host_reserve field, and the join of the two branches of
# this session's migrations (idle replicas, kill-stray).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('console', '0035_idle_replicas'),
        ('console', '0038_kill_stray'),
    ]

    operations = [
        migrations.AddField(
            model_name='policy',
            name='hold_host_reserve',
            field=models.PositiveIntegerField(default=0, help_text='1 holds the reserve per host against measured use, 0 only at placement'),
        ),
    ]
