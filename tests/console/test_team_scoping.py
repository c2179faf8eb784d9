"""Teams over the whole API, by enumeration: an operator or viewer of team alpha gets 404 for
every read and write of team bravo's jobs, and no list shows them.

The routes are walked from Django's URL resolver, not listed by hand: every URL pattern under
/api/ must be in one of the classes below, so an endpoint added later fails this test until it
is classified (and then it is checked like the others).
"""

from __future__ import annotations

import importlib
import json
from datetime import timedelta

import plotly.utils
import pytest
from dash.exceptions import PreventUpdate
from django.apps import apps as django_apps
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone
from rest_framework.test import APIClient

from console.dash import controls
from console.dash.job import callbacks as job_callbacks
from console.dash.overview import callbacks as overview_callbacks
from console.dash.placement import callbacks as placement_callbacks
from console.dash.recoveries import callbacks as recovery_callbacks
from console.models import (
    Alert,
    AlertDelivery,
    AlertRoute,
    FaultInjection,
    Job,
    JobUpgrade,
    Policy,
    RecoveryEpisode,
    ReportSubscription,
    Team,
)
from console.roles import ADMIN, OPERATOR, VIEWER
from console.services import alerts, reports
from console.services.teams import jobs_visible_to
from tests.factories import (
    EpisodeFactory,
    FaultFactory,
    NodeFactory,
    ReportSubscriptionFactory,
    UserFactory,
    make_job,
)

# Routes whose path names one job (`job_pk`, or `pk` of /api/jobs/{pk}/...): another team's job
# answers 404 to every method, for viewers and operators alike.
JOB_PATH = {
    "job-detail",
    "job-stop",
    "job-restart",
    "job-supervision",
    "job-results",
    "job-upgrade",
    "job-fault-list",
    "job-upgrade-list",
    "job-upgrade-detail",
    "job-upgrade-confirm",
    "job-upgrade-rollback",
    "job-recovery-list",
    # An alert of another team's job, a route naming another team: not found, as the job.
    "alert-detail",
    "alert-route-detail",
}
# Routes that answer about many jobs: never one of another team's, nor counted in totals.
MANY_JOBS = {"job-list", "recovery-list", "fleet", "alert-list", "alert-delivery-list"}
# Routes with no job data (nodes, the policy, registered code, tokens, the schema, the audit log
# for admins only): the same for every team.
NO_JOB_DATA = {
    "api-root",
    "api-token",
    "api-schema",
    "api-docs",
    "policy",
    "policy-history",
    "policy-revert",
    "node-list",
    "node-detail",
    "topology-list",
    "audit",
    # Routes naming no team nor job are everyone's; the others are checked as JOB_PATH.
    "alert-route-list",
}
SECRET = "bravo-secret-job"
MISSING_ID = 2**31 - 7


def _params(pattern) -> set[str]:
    regex = pattern.regex
    return set(regex.groupindex)


def api_routes() -> list[tuple[str, frozenset[str], object]]:
    """(URL name, path parameter names, view callback) of every pattern under /api/."""
    found = []

    def walk(patterns, prefix: str, params: frozenset[str]):
        for entry in patterns:
            here = prefix + str(entry.pattern).lstrip("^")
            names = params | _params(entry.pattern)
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, here, names)
            elif isinstance(entry, URLPattern) and here.startswith("api/"):
                found.append((entry.name, names, entry.callback, here))

    walk(get_resolver().url_patterns, "", frozenset())
    return found


def allowed_methods(callback) -> list[str]:
    """The HTTP methods the view answers (a viewset's bound actions, an APIView's handlers)."""
    actions = getattr(callback, "actions", None)
    if actions is not None:
        methods = {method.upper() for method in actions}
    else:
        view = callback.view_class(**getattr(callback, "view_initkwargs", {}))
        methods = set(view.allowed_methods)
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods | {"OPTIONS"})


@pytest.fixture
def world(db):
    """Teams alpha and bravo, each with a running job, a fault, an upgrade and an episode."""
    alpha, bravo = Team.named("alpha"), Team.named("bravo")
    node = NodeFactory()
    Policy.current()
    jobs = {
        "alpha": make_job(Job.Status.RUNNING, name="alpha-job", team=alpha),
        "bravo": make_job(Job.Status.RUNNING, name=SECRET, team=bravo),
    }
    upgrades, alerts, routes = {}, {}, {}
    for team, job in jobs.items():
        FaultFactory(job=job)
        EpisodeFactory(job=job)
        upgrades[team] = JobUpgrade.objects.create(
            job=job, from_topology=job.topology, to_topology=job.topology
        )
        routes[team] = AlertRoute.objects.create(
            name=f"{team}-pager", channel="webhook", target="http://127.0.0.1:9/hook"
        )
        routes[team].teams.add(Team.named(team))
        alerts[team] = Alert.objects.create(
            key=f"job-failed:{job.key}:1", event="job-failed", severity="critical", job=job,
            summary=f"{job.name} failed for good",
        )  # fmt: skip
        AlertDelivery.objects.create(alert=alerts[team], route=routes[team])
    people = {
        OPERATOR: UserFactory(username="alpha-op", role=OPERATOR, team="alpha"),
        VIEWER: UserFactory(username="alpha-viewer", role=VIEWER, team="alpha"),
        ADMIN: UserFactory(username="root-admin", role=ADMIN, team="alpha"),
    }
    return {
        "jobs": jobs,
        "upgrades": upgrades,
        "alerts": alerts,
        "routes": routes,
        "node": node,
        "people": people,
        "bravo": bravo,
    }


def url_for(name: str, params, world, job_id: int, upgrade_id: int, team: str = "") -> str:
    """Route `name` with its path parameters filled: the job and upgrade given where the path
    names them (and `team`'s alert and route), the node and the policy version in force
    elsewhere."""
    values = {}
    for param in params:
        if param == "format":
            values[param] = "json"
        elif param == "job_pk":
            values[param] = job_id
        elif param == "pk" and name.startswith("job-upgrade-"):
            values[param] = upgrade_id
        elif param == "pk" and name == "alert-detail":
            values[param] = world["alerts"][team].pk if team else MISSING_ID
        elif param == "pk" and name == "alert-route-detail":
            values[param] = world["routes"][team].pk if team else MISSING_ID
        elif param == "pk" and name.startswith("node-"):
            values[param] = world["node"].pk
        elif param == "pk":
            values[param] = job_id
        elif param == "version":
            values[param] = Policy.current().version
        else:
            raise AssertionError(f"{name}: no value for path parameter {param!r}")
    return reverse(name, kwargs=values)


def team_url(name: str, params, world, team: str) -> str:
    """Route `name` on team `team`'s job and upgrade."""
    job, upgrade = world["jobs"][team], world["upgrades"][team]
    return url_for(name, params, world, job.pk, upgrade.pk, team)


def bravo_state(bravo: Team) -> dict:
    """What a write to team bravo's jobs would change."""
    jobs = Job.objects.filter(team=bravo)
    return {
        "jobs": sorted(jobs.values_list("pk", "status", "strategy", "topology")),
        "faults": FaultInjection.objects.filter(job__in=jobs).count(),
        "upgrades": sorted(
            JobUpgrade.objects.filter(job__in=jobs).values_list("pk", "status", "requested_action")
        ),
        "episodes": RecoveryEpisode.objects.filter(job__in=jobs).count(),
        "alerts": sorted(Alert.objects.filter(job__in=jobs).values_list("pk", "state")),
        "routes": sorted(
            AlertRoute.objects.filter(teams=bravo).values_list("pk", "name", "target", "enabled")
        ),
    }


def job_ids_in(data) -> set[int]:
    """Every job id an answer mentions: `job` fields, and the `id` of job objects."""
    found = set()
    if isinstance(data, dict):
        if isinstance(data.get("job"), int):
            found.add(data["job"])
        if "key" in data and "topology" in data and isinstance(data.get("id"), int):
            found.add(data["id"])
        for value in data.values():
            found |= job_ids_in(value)
    elif isinstance(data, list):
        for value in data:
            found |= job_ids_in(value)
    return found


def call(client, method: str, url: str):
    return getattr(client, method.lower())(url, data={}, format="json")


def test_every_api_route_is_classified():
    unknown = sorted(
        here
        for name, _params_, _callback, here in api_routes()
        if name not in JOB_PATH | MANY_JOBS | NO_JOB_DATA
    )
    assert not unknown, (
        f"API routes this test cannot classify: {unknown}; add their URL names to JOB_PATH, "
        "MANY_JOBS or NO_JOB_DATA in tests/console/test_team_scoping.py"
    )


def check_job_path(client, name: str, params, methods, world) -> None:
    """Every method of a route naming team bravo's job answers as if the job did not exist."""
    url = team_url(name, params, world, "bravo")
    missing = url_for(name, params, world, MISSING_ID, MISSING_ID)
    for method in methods:
        answer = call(client, method, url)
        if method == "OPTIONS":
            # Describes the endpoint, not the job: the same as for a job that does not exist.
            absent = call(client, method, missing)
            assert (answer.status_code, answer.content) == (absent.status_code, absent.content)
        else:
            assert answer.status_code == 404, f"{method} {url}: {answer.status_code}"
            assert SECRET.encode() not in answer.content
    if "GET" in methods:
        # The same route on the user's own team's job is found: the 404s above are the team's
        # doing, not a route that answers 404 to everyone.
        own = team_url(name, params, world, "alpha")
        assert client.get(own).status_code != 404, own


def check_other_route(client, name: str, params, methods, world) -> None:
    """A route not naming a job never shows team bravo's jobs."""
    if "GET" not in methods:
        return
    url = team_url(name, params, world, "alpha")
    answer = client.get(url)
    assert answer.status_code < 500, url
    assert SECRET.encode() not in answer.content, url
    if name in MANY_JOBS and answer.status_code == 403:
        # A list the role may not read (alerts and deliveries are for operators): a refusal
        # says nothing of any job.
        assert name.startswith("alert"), url
    elif name in MANY_JOBS:
        assert answer.status_code == 200, url
        mentioned = job_ids_in(json.loads(answer.content))
        assert world["jobs"]["bravo"].pk not in mentioned, url
        assert world["jobs"]["alpha"].pk in mentioned or name == "fleet", url


@pytest.mark.parametrize("role", [OPERATOR, VIEWER])
def test_another_teams_jobs_are_not_found_over_the_whole_api(world, role):
    client = APIClient()
    client.force_authenticate(world["people"][role])
    before = bravo_state(world["bravo"])
    checked = set()
    for name, params, callback, _here in api_routes():
        methods = allowed_methods(callback)
        if name in JOB_PATH:
            check_job_path(client, name, params, methods, world)
        else:
            check_other_route(client, name, params, methods, world)
        checked.add(name)
    assert bravo_state(world["bravo"]) == before, "a request changed team bravo's jobs"
    assert checked >= JOB_PATH | MANY_JOBS, sorted(JOB_PATH | MANY_JOBS - checked)


@pytest.mark.parametrize("role", [OPERATOR, VIEWER])
def test_totals_count_the_users_teams_only(world, role):
    client = APIClient()
    client.force_authenticate(world["people"][role])
    fleet = client.get("/api/fleet/").json()
    listed = client.get("/api/jobs/").json()
    assert fleet["jobs"]["total"] == 1
    assert listed["totals"]["jobs"]["total"] == 1
    assert [job["id"] for job in listed["results"]] == [world["jobs"]["alpha"].pk]
    assert listed["results"][0]["team"] == "alpha"
    assert (
        fleet["open_recoveries"]
        == RecoveryEpisode.objects.filter(
            job=world["jobs"]["alpha"], watched_s__isnull=True
        ).count()
    )


def test_admins_see_and_act_on_every_team(world):
    client = APIClient()
    client.force_authenticate(world["people"][ADMIN])
    bravo_job = world["jobs"]["bravo"]
    assert client.get(f"/api/jobs/{bravo_job.pk}/").json()["team"] == "bravo"
    assert client.get("/api/fleet/").json()["jobs"]["total"] == 2
    assert client.post(f"/api/jobs/{bravo_job.pk}/stop/").status_code == 200


NEW_JOB = {"name": "wc", "topology": "wordcount", "strategy": "adaptive"}


def test_a_new_job_goes_to_the_users_only_team(world):
    client = APIClient()
    client.force_authenticate(world["people"][OPERATOR])
    answer = client.post("/api/jobs/", NEW_JOB, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["team"] == "alpha"
    assert Job.objects.get(pk=answer.json()["id"]).team.name == "alpha"


@pytest.mark.parametrize(
    ("team", "why"),
    [("bravo", "not a member"), ("nosuch", "does not exist")],
)
def test_a_new_job_of_a_team_not_the_users_is_refused_naming_team(world, team, why):
    client = APIClient()
    client.force_authenticate(world["people"][OPERATOR])
    answer = client.post("/api/jobs/", {**NEW_JOB, "team": team}, format="json")
    assert answer.status_code == 400
    assert "team" in answer.json()["error"]["detail"]
    assert not Job.objects.filter(name="wc").exists()


def test_a_member_of_several_teams_must_choose(world):
    user = world["people"][OPERATOR]
    user.groups.add(world["bravo"].group)
    client = APIClient()
    client.force_authenticate(user)
    answer = client.post("/api/jobs/", NEW_JOB, format="json")
    assert answer.status_code == 400
    assert "choose one of alpha, bravo" in answer.json()["error"]["detail"]["team"][0]
    chosen = client.post("/api/jobs/", {**NEW_JOB, "team": "bravo"}, format="json")
    assert chosen.status_code == 201 and chosen.json()["team"] == "bravo"
    assert jobs_visible_to(user).count() == 3


def _text(component) -> str:
    """Everything a callback's answer would send the browser, as text."""
    return json.dumps(component, cls=plotly.utils.PlotlyJSONEncoder)


@pytest.mark.parametrize("role", [OPERATOR, VIEWER])
def test_the_console_shows_nothing_of_another_teams_jobs(world, role):
    user = world["people"][role]
    bravo = world["jobs"]["bravo"]
    browser = Client()
    browser.force_login(user)
    assert browser.get(f"/console/jobs/{bravo.pk}/").status_code == 404
    assert browser.get(f"/console/jobs/{world['jobs']['alpha'].pk}/").status_code == 200
    with pytest.raises(PreventUpdate):
        job_callbacks.refresh(1, 300, f"/console/jobs/{bravo.pk}/", user=user)
    assert job_callbacks.render_controls(f"/console/jobs/{bravo.pk}/", user=user) is None
    pages = [
        overview_callbacks.refresh(1, 300, user=user),
        overview_callbacks.filter_options("/console/", user=user),
        recovery_callbacks.job_options(1, user=user),
        recovery_callbacks.refresh(1, [bravo.pk], 300, user=user),
        placement_callbacks.refresh(1, user=user),
    ]
    for answer in pages:
        assert SECRET not in _text(answer)
    alpha = world["jobs"]["alpha"].pk
    assert recovery_callbacks.job_options(1, user=user) == [
        {"label": f"alpha-job (adaptive, #{alpha})", "value": alpha}
    ]


def test_console_controls_refuse_another_teams_job_as_missing(world):
    operator = world["people"][OPERATOR]
    bravo = world["jobs"]["bravo"]
    before = bravo_state(world["bravo"])
    for act in (
        lambda: controls.stop_job(operator, bravo.pk),
        lambda: controls.restart_job(operator, bravo.pk),
        lambda: controls.inject_fault(
            operator, bravo.pk, kind="kill-driver", operator="count", node_id=None, duration_s=None
        ),
        lambda: controls.change_strategy(operator, bravo.pk, "active-all"),
        lambda: controls.roll_back_upgrade(operator, world["upgrades"]["bravo"].pk),
    ):
        with pytest.raises(controls.ActionRefused, match="no such"):
            act()
    assert bravo_state(world["bravo"]) == before


def test_a_teams_report_holds_its_jobs_only(world):
    now = timezone.now()
    for job in world["jobs"].values():
        EpisodeFactory(job=job, detected_at=now - timedelta(hours=1))
    subscription = ReportSubscriptionFactory(
        name="alpha daily", scope=ReportSubscription.Scope.TEAM, team=Team.named("alpha")
    )
    report = reports.report_for_subscription(subscription, now=now + timedelta(minutes=1))
    assert {row.job_name for row in report.episodes} == {"alpha-job"}
    assert {row.job_name for row in report.upgrades} <= {"alpha-job"}
    assert list(alerts.subscriptions_for(world["jobs"]["alpha"])) == [subscription]
    assert list(alerts.subscriptions_for(world["jobs"]["bravo"])) == []


def test_admins_add_a_team_with_its_group_in_the_admin(world):
    admin_user = world["people"][ADMIN]
    admin_user.is_staff = admin_user.is_superuser = True
    admin_user.save()
    browser = Client()
    browser.force_login(admin_user)
    added = browser.post("/admin/console/team/add/", {"name": "payments"})
    assert added.status_code == 302, added.content[:1000]
    team = Team.objects.get(name="payments")
    assert team.group.name == "team:payments"
    listed = browser.get("/admin/console/job/", {"team__id__exact": world["bravo"].pk})
    assert SECRET.encode() in listed.content and b"alpha-job" not in listed.content


def test_the_migration_puts_existing_jobs_and_role_users_in_the_default_team(world):
    """0028's data step, run on rows made before teams existed (no team, no team group)."""
    people = world["people"]
    job = make_job(Job.Status.RUNNING)
    Job.objects.filter(pk=job.pk).update(team=None)
    nobody = UserFactory(username="nobody")
    migration = importlib.import_module("console.migrations.0028_team_scoping")
    migration.default_team(django_apps, None)
    job.refresh_from_db()
    assert job.team.name == "default"
    members = set(Team.named("default").group.user_set.values_list("username", flat=True))
    assert members == {user.username for user in people.values()}
    assert nobody.username not in members
