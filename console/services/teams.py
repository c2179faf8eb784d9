"""Which jobs a person sees and acts on: the one place that scopes jobs by team.

Admins (and superusers) see every job; viewers and operators see the jobs of the teams whose
group they belong to (console.models.Team). Every API view, console page and callback, report
and command acting for a user reads jobs through `jobs_visible_to`, so a job of another team is
"not found" everywhere, never "forbidden": its existence does not leak.
"""

from __future__ import annotations

from django.contrib.auth.models import Group
from django.db.models import Exists, Q, QuerySet
from django.http import Http404

from console.models import Job, Team
from console.models.teams import TEAM_GROUP_PREFIX
from console.roles import ADMIN, has_role

DEFAULT_TEAM = "default"


class TeamRequestError(Exception):
    """A team asked for (or left out) that the user cannot give a new job; names the field."""

    field = "team"


def sees_every_team(user) -> bool:
    """Admins and superusers act on every team's jobs."""
    return has_role(user, ADMIN)


def teams_of(user) -> QuerySet[Team]:
    """The teams `user` is a member of (through the team's group)."""
    if user is None or not user.is_authenticated:
        return Team.objects.none()
    return Team.objects.filter(group__user=user)


def jobs_visible_to(user, jobs: QuerySet[Job] | None = None) -> QuerySet[Job]:
    """`jobs` (every job by default) narrowed to the ones `user` may see and act on."""
    jobs = Job.objects.all() if jobs is None else jobs
    if user is None or not user.is_authenticated:
        return jobs.none()
    if user.is_superuser:
        return jobs
    # One condition inside the query that reads the jobs, not a query of its own to learn the
    # role first: pages and lists read jobs in a fixed number of queries.
    is_admin = Exists(Group.objects.filter(user=user, name=ADMIN))
    return jobs.filter(Q(team__in=teams_of(user).values("pk")) | Q(is_admin))


def visible_job_or_404(user, job_id) -> Job:
    """The job `job_id` if `user` may see it; Http404 otherwise (also for a malformed id)."""
    try:
        return jobs_visible_to(user).get(pk=int(job_id))
    except (Job.DoesNotExist, TypeError, ValueError):
        raise Http404("no such job") from None


def scope_key(user) -> str:
    """What the jobs `user` sees depend on, for keys of data shared between readers: "all" for
    admins, else the names of their teams' groups (one query)."""
    if user is None or not user.is_authenticated:
        return "none"
    if user.is_superuser:
        return "all"
    groups = set(user.groups.values_list("name", flat=True))
    if ADMIN in groups:
        return "all"
    return "teams:" + ",".join(sorted(g for g in groups if g.startswith(TEAM_GROUP_PREFIX)))


def team_for_new_job(user, name: str | None) -> Team:
    """The team a job `user` creates belongs to: `name`, or the user's only team.

    TeamRequestError when the name is unknown, names a team a non-admin is not in, or is left
    out while the user is in several teams (or none)."""
    mine = list(teams_of(user).order_by("name"))
    if name:
        team = Team.objects.filter(name=name).first()
        if team is None:
            raise TeamRequestError(f"team: no team named {name!r}")
        if not sees_every_team(user) and team not in mine:
            raise TeamRequestError(f"team: you are not a member of {name!r}")
        return team
    if len(mine) == 1:
        return mine[0]
    if mine:
        raise TeamRequestError(f"team: choose one of {', '.join(t.name for t in mine)}")
    if sees_every_team(user):
        return Team.named(DEFAULT_TEAM)
    raise TeamRequestError("team: you are in no team; ask an admin to add you to one")
