"""Join the two branches that both follow 0027: team scoping and the OIDC identities. Neither
touches the other's tables, so there is nothing to do but join them."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0028_oidc_identity"),
        ("console", "0028_team_scoping"),
    ]

    operations = []
