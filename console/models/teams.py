"""Teams that own jobs, and the audit log of every write.

A team's members are the users of its Django group (`team.group`), so an identity provider's
group claim maps to teams the same way it maps to roles. Jobs import this module (Job.team);
it imports no other model module.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models
from django.utils import timezone

# A team's group is named with this prefix, so a team never shares a name with a role group
# (viewer, operator, admin).
TEAM_GROUP_PREFIX = "team:"


class Team(models.Model):
    """People who own jobs: viewers and operators see and act on their teams' jobs only."""

    name = models.SlugField(max_length=60, unique=True)
    group = models.OneToOneField(Group, on_delete=models.PROTECT, related_name="team")

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @classmethod
    def named(cls, name: str) -> Team:
        """The team called `name`, created with its group when it does not exist yet."""
        group, _ = Group.objects.get_or_create(name=f"{TEAM_GROUP_PREFIX}{name}")
        team, _ = cls.objects.get_or_create(name=name, defaults={"group": group})
        return team


class AuditEvent(models.Model):
    """One write to Backstop by a person or a service: who, when, what and from where.

    `action` is dotted, domain first (`fault.inject`, `policy.change`, `login`, ...); `target`
    names what was written (`job:12`, `route:3`); `detail` holds the values. `actor_name` keeps
    the name when the user is deleted later.
    """

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    actor_name = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=60, db_index=True)
    target = models.CharField(max_length=200, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    address = models.GenericIPAddressField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self):
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name or '-'} {self.action} {self.target}"
