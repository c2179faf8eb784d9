"""Callbacks called directly against a factory-built database, and the pages and the Dash
endpoint through Django's test client."""

import json

import pytest
from dash.exceptions import PreventUpdate
from django.contrib.auth.models import AnonymousUser

from console.dash.controls import RoleRefused
from console.dash.job import callbacks as job_callbacks
from console.dash.overview import callbacks as overview_callbacks
from console.dash.placement import callbacks as placement_callbacks
from console.dash.recoveries import callbacks as recovery_callbacks
from console.dash.resources import callbacks as resource_callbacks
from console.models import FaultInjection, Job, Policy, PredictorTraining
from console.redis import redis_client
from console.roles import ADMIN, OPERATOR, VIEWER
from infra import keys
from tests.dash.components import ids_in, text_of
from tests.dash.seed import seed_console

pytestmark = pytest.mark.django_db


@pytest.fixture
def seeded():
    return seed_console(minutes=5)


def _job_path(job) -> str:
    return f"/console/jobs/{job.pk}/"


# --- read callbacks -------------------------------------------------------------------------


def test_overview_refresh_shows_jobs_nodes_and_episodes(seeded, users):
    kpis, jobs, episodes, nodes, utilisation, throughput = overview_callbacks.refresh(
        1, 300, user=users[VIEWER]
    )
    assert "running jobs" in text_of(kpis)
    assert "wc-adaptive" in text_of(jobs) and "wc-restart" in text_of(jobs)
    assert "kill-driver on count" in text_of(episodes)
    assert "node-a" in text_of(nodes)
    assert len(utilisation.data) == 2
    assert {t.name for t in throughput.data} == {"wc-adaptive", "wc-restart"}


@pytest.mark.parametrize(
    "call",
    [
        lambda user: overview_callbacks.refresh(1, 300, user=user),
        lambda user: job_callbacks.refresh(1, 300, "/console/jobs/1/", user=user),
        lambda user: placement_callbacks.refresh(1, user=user),
        lambda user: recovery_callbacks.refresh(1, None, 300, user=user),
        lambda user: resource_callbacks.refresh(1, 300, user=user),
    ],
)
def test_read_callbacks_answer_nothing_to_users_without_a_role(seeded, users, call):
    for user in (AnonymousUser(), users[None]):
        with pytest.raises(PreventUpdate):
            call(user)


def test_job_refresh_shows_a_supervision_that_keeps_failing(seeded, users):
    client = redis_client()
    key = keys.reconcile_failures(seeded.adaptive.key)
    entry = {"failures": 4, "since": 0.0, "at": 15.0, "error": "TypeError: boom",
             "retry_in_s": 8.0, "controller": "ctl-a"}  # fmt: skip
    client.set(key, json.dumps(entry))
    try:
        outputs = job_callbacks.refresh(1, 300, _job_path(seeded.adaptive), user=users[VIEWER])
    finally:
        client.delete(key)
    text = text_of(outputs[1])
    assert "Supervision failing" in text and "4 reconciles in a row failed since 1970" in text
    assert "next try in 8 s" in text and "TypeError: boom" in text


def test_job_refresh_shows_operators_decisions_failures_and_faults(seeded, users):
    outputs = job_callbacks.refresh(1, 300, _job_path(seeded.adaptive), user=users[VIEWER])
    summary, failure, dag, replicas, operators, history, decisions, failures, faults, *_ = outputs
    assert "running" in text_of(summary)
    assert failure is None  # only a failed job shows why it failed
    assert {t.marker.color for t in dag.data} == {"#2457d6", "#8a94a6"}
    assert "standby" in text_of(replicas)
    # How each replica shares the CPU (the seeded reports: primaries at -5, the standby paced).
    assert "nice -5" in text_of(replicas) and "nice 5 · every 3 s" in text_of(replicas)
    assert "count" in text_of(operators) and "0.58" in text_of(operators)
    assert {t.name for t in history.data if t.showlegend} == {"source", "split", "count", "sink"}
    assert "add-standby" in text_of(decisions)
    assert "Killed (signal 9)" in text_of(failures)
    assert "promote: standby on node-c promoted" in text_of(failures)
    assert "kill-driver" in text_of(faults)


def test_a_failed_job_shows_its_cause_and_log_lines_and_operators_can_restart_it(seeded, users):
    job = seeded.adaptive
    Job.objects.filter(pk=job.pk).update(
        status=Job.Status.FAILED,
        status_reason="gave up: count: 8 primary failures within 600 s\n\nlast log lines:\nboom",
    )
    outputs = job_callbacks.refresh(1, 300, _job_path(job), user=users[VIEWER])
    failure = text_of(outputs[1])
    assert "gave up: count: 8 primary failures within 600 s" in failure and "boom" in failure
    result = job_callbacks.restart_confirmed(1, _job_path(job), user=users[OPERATOR])
    assert "restart requested" in text_of(result)
    with pytest.raises(RoleRefused):
        job_callbacks.restart_confirmed(1, _job_path(job), user=users[VIEWER])
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING)
    result = job_callbacks.restart_confirmed(1, _job_path(job), user=users[OPERATOR])
    assert "only a failed or stopped job can be restarted" in text_of(result)


def test_job_id_comes_from_the_path():
    assert job_callbacks.job_id_from_path("/console/jobs/12/") == 12
    assert job_callbacks.job_id_from_path("/console/") is None
    assert job_callbacks.job_id_from_path(None) is None


def test_placement_refresh_lists_replicas_per_node_and_the_reserve(seeded, users):
    outputs = placement_callbacks.refresh(1, user=users[VIEWER])
    summary, idle, q, q_note, cards, shown, standbys, policy, predictor, _reserve = outputs
    assert shown == "3 of 3 nodes shown, in queue order by Q"
    reserve = Policy.current().resource_reserve
    assert f"{reserve * 100:.0f}%" in text_of(summary)
    assert [s.y0 for s in idle.layout.shapes] == [reserve * 100]
    assert "Q runs from 0 to 2.33" in q_note
    card_text = {c.id: text_of(c) for c in cards}
    assert "wc-adaptive/count" in card_text["node-node-c"]  # the standby
    # How each replica shares the CPU, as it reports it.
    assert "wc-adaptive/count nice -5" in card_text["node-node-b"]
    assert "wc-adaptive/count nice 5 · every 3 s" in card_text["node-node-c"]
    # Why the standby is on node-c: the seeded verdict, and node-c's Q rank (the busiest of the
    # three seeded nodes, so #3).
    standby_text = text_of(standbys)
    assert "wc-adaptive/count" in standby_text and "#3 of 3" in standby_text
    assert "kept: started 40 s ago" in standby_text
    assert "kept after this cycle" in standby_text
    assert f"Version {Policy.current().version}" in text_of(policy)
    assert "Not trained yet: operators get the prior fr" in text_of(predictor)


def test_placement_shows_the_predictor_runs_and_which_is_in_force(seeded, users):
    common = {"window_s": 60.0, "history_s": 21600.0, "prior": 0.05, "features": []}
    older = PredictorTraining.objects.create(
        samples=40, failures=6, holdout_samples=12, used=True, mse=0.08, prior_mse=0.12, r2=0.21,
        reason="used (held-out MSE 0.0800 vs prior 0.1200 on 12 samples)", **common,
    )  # fmt: skip
    *_, predictor, _reserve = placement_callbacks.refresh(1, user=users[VIEWER])
    assert f"In force: model #{older.pk}" in text_of(predictor)
    assert "0.0800 / 0.1200" in text_of(predictor) and "0.210" in text_of(predictor)
    newer = PredictorTraining.objects.create(
        samples=8, failures=0, used=False, reason="not used: 8 samples < minimum 20", **common
    )
    *_, predictor, _reserve = placement_callbacks.refresh(1, user=users[VIEWER])
    text = text_of(predictor)
    assert f"the newest model (#{newer.pk}) is not used" in text
    assert text.index("not used: 8 samples < minimum 20") < text.index("used (held-out MSE")


def test_recoveries_refresh_compares_the_newest_jobs(seeded, users):
    timelines, phases, episodes, strategies, strategy_table = recovery_callbacks.refresh(
        1, None, 3600, user=users[VIEWER]
    )
    titles = {a.text for a in timelines.layout.annotations}
    # A bar per episode, split into its phases: the promotion started no process.
    by_phase = {trace.name: dict(zip(trace.y, trace.x, strict=True)) for trace in phases.data}
    promoted = next(label for label in by_phase["detection"] if "promote" in label)
    restarted = next(label for label in by_phase["detection"] if "restart-job" in label)
    assert by_phase["process start"][promoted] == 0.0
    assert by_phase["state restore"][restarted] == pytest.approx(11.0)
    assert sum(by_phase[name][restarted] for name in by_phase) == pytest.approx(24.0)
    assert {"wc-adaptive · adaptive", "wc-restart · restart-all"} <= titles
    assert "restart-job" in text_of(episodes)
    assert {"adaptive", "restart-all"} <= set(strategies.data[0].x)
    assert "restart-all" in text_of(strategy_table)


def test_resources_refresh_plots_every_node(seeded, users):
    figure, note = resource_callbacks.refresh(1, 300, user=users[VIEWER])
    assert {t.name for t in figure.data} == {"node-a", "node-b", "node-c"}
    assert note.startswith("3 nodes")


# --- controls -------------------------------------------------------------------------------


def test_controls_are_rendered_only_for_roles_that_may_use_them(seeded, users):
    path = _job_path(seeded.adaptive)
    assert job_callbacks.render_controls(path, user=users[VIEWER]) is None
    assert "fault-button" in ids_in(job_callbacks.render_controls(path, user=users[OPERATOR]))
    assert overview_callbacks.render_controls("/console/", user=users[VIEWER]) is None
    assert "start-button" in ids_in(overview_callbacks.render_controls("/", user=users[OPERATOR]))
    assert placement_callbacks.render_controls("/", user=users[OPERATOR]) is None
    assert "threshold-button" in ids_in(placement_callbacks.render_controls("/", user=users[ADMIN]))


def _inject(seeded, user, operator="split"):
    return job_callbacks.inject_confirmed(
        1, "kill-driver", operator, None, None, _job_path(seeded.adaptive), user=user
    )


def test_a_viewer_cannot_inject_a_fault(seeded, users):
    before = FaultInjection.objects.count()
    with pytest.raises(RoleRefused, match="needs the operator role"):
        _inject(seeded, users[VIEWER])
    assert FaultInjection.objects.count() == before


def test_an_operator_injects_a_fault_recorded_with_their_name(seeded, users):
    result = _inject(seeded, users[OPERATOR])
    assert "requested" in text_of(result)
    fault = FaultInjection.objects.get(job=seeded.adaptive, target_operator="split")
    assert fault.requested_by == users[OPERATOR]
    assert fault.kind == "kill-driver"


def test_node_faults_go_to_the_chosen_node_with_their_duration(seeded, users):
    node = seeded.nodes[1]
    job_callbacks.inject_confirmed(
        1, "pause-node", "split", node.pk, 5, _job_path(seeded.adaptive), user=users[OPERATOR]
    )
    fault = FaultInjection.objects.get(job=seeded.adaptive, kind="pause-node")
    assert (fault.target_node, fault.target_operator, fault.params) == (node, "", {"duration_s": 5})


def test_the_fault_service_refusal_is_shown(seeded, users):
    result = _inject(seeded, users[OPERATOR], operator="no-such-operator")
    assert "no operator 'no-such-operator'" in text_of(result)


def test_the_confirm_step_names_the_fault_and_target(seeded):
    displayed, message = job_callbacks.ask_fault(
        1, "kill-driver", "count", None, "/console/jobs/3/"
    )
    assert displayed is True
    assert message == "Inject kill-driver on operator count of job #3?"
    assert job_callbacks.target_fields("kill-node") == (True, False)
    assert job_callbacks.target_fields("kill-driver") == (False, True)


def test_stop_is_refused_for_a_viewer_and_works_for_an_operator(seeded, users):
    job = seeded.baseline
    with pytest.raises(RoleRefused):
        job_callbacks.stop_confirmed(1, _job_path(job), user=users[VIEWER])
    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING
    overview_callbacks.stop_confirmed(1, job.pk, user=users[OPERATOR])
    job.refresh_from_db()
    assert job.status in (Job.Status.STOPPING, Job.Status.STOPPED)


def test_start_is_refused_for_a_viewer_and_creates_a_job_for_an_operator(seeded, users):
    args = (1, "new-wc", "wordcount", "adaptive", 300)
    with pytest.raises(RoleRefused):
        overview_callbacks.start_clicked(*args, user=users[VIEWER])
    assert not Job.objects.filter(name="new-wc").exists()
    overview_callbacks.start_clicked(*args, user=users[OPERATOR])
    job = Job.objects.get(name="new-wc")
    assert (job.created_by, job.params["rate"], job.operators.count()) == (users[OPERATOR], 300, 4)


def test_thresholds_change_only_for_admins(seeded, users):
    version = Policy.current().version
    with pytest.raises(RoleRefused, match="needs the admin role"):
        placement_callbacks.threshold_confirmed(
            1, "resource_reserve", 0.3, "more headroom", user=users[OPERATOR]
        )
    assert Policy.current().version == version
    placement_callbacks.threshold_confirmed(
        1, "resource_reserve", 0.3, "more headroom", user=users[ADMIN]
    )
    policy = Policy.current()
    assert (policy.version, policy.resource_reserve, policy.created_by) == (
        version + 1,
        0.3,
        users[ADMIN],
    )


def test_integer_thresholds_accept_whole_numbers_from_number_inputs(seeded, users):
    placement_callbacks.threshold_confirmed(1, "q_samples", 7.0, "longer memory", user=users[ADMIN])
    assert Policy.current().q_samples == 7


# --- through Django -------------------------------------------------------------------------

PAGES = ["/console/", "/console/placement/", "/console/recoveries/", "/console/resources/"]


def test_pages_need_a_login(client, seeded):
    for url in [*PAGES, _job_path(seeded.adaptive)]:
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")


def test_pages_embed_their_dash_app(client, seeded, users):
    client.force_login(users[VIEWER])
    for url, app in zip(
        [*PAGES, _job_path(seeded.adaptive)],
        ["overview", "placement", "recoveries", "resources", "job"],
        strict=True,
    ):
        response = client.get(url)
        assert response.status_code == 200
        assert f"/django_plotly_dash/app/backstop-{app}/" in response.content.decode()
    assert client.get("/console/jobs/999999/").status_code == 404


def test_the_dash_endpoint_checks_the_role_of_the_logged_in_user(client, seeded, users):
    """A viewer posting straight to the update endpoint (no button needed) gets 403."""
    body = {
        "output": "fault-result.children",
        "outputs": {"id": "fault-result", "property": "children"},
        "inputs": [{"id": "fault-confirm", "property": "submit_n_clicks", "value": 1}],
        "state": [
            {"id": "fault-kind", "property": "value", "value": "kill-driver"},
            {"id": "fault-operator", "property": "value", "value": "split"},
            {"id": "fault-node", "property": "value", "value": None},
            {"id": "fault-duration", "property": "value", "value": None},
            {"id": "url", "property": "pathname", "value": _job_path(seeded.adaptive)},
            {"id": "fault-workers", "property": "value", "value": None},
        ],
        "changedPropIds": ["fault-confirm.submit_n_clicks"],
    }
    url = "/django_plotly_dash/app/backstop-job/_dash-update-component"
    client.force_login(users[VIEWER])
    response = client.post(url, json.dumps(body), content_type="application/json")
    assert response.status_code == 403
    assert not FaultInjection.objects.filter(target_operator="split").exists()

    client.force_login(users[OPERATOR])
    response = client.post(url, json.dumps(body), content_type="application/json")
    assert "requested" in response.content.decode()
    assert FaultInjection.objects.get(target_operator="split").requested_by == users[OPERATOR]


def _all_ids(component) -> list[str]:
    """Every string id in a tree, duplicates kept."""
    if isinstance(component, list | tuple):
        return [i for child in component for i in _all_ids(child)]
    if component is None or isinstance(component, str | int | float):
        return []
    own = [component.id] if isinstance(getattr(component, "id", None), str) else []
    return own + _all_ids(getattr(component, "children", None))


def test_ids_are_unique_on_every_page_once_filled_in(seeded, users):
    """A repeated id sends a callback's output to the wrong component (it happened once)."""
    from console.dash.job import layout as job_layout
    from console.dash.overview import layout as overview_layout
    from console.dash.placement import layout as placement_layout
    from console.dash.recoveries import layout as recovery_layout
    from console.dash.resources import layout as resource_layout

    admin, path = users[ADMIN], _job_path(seeded.adaptive)
    pages = {
        "overview": (overview_layout.layout(), overview_callbacks.refresh(1, 300, user=admin)),
        "job": (job_layout.layout(), job_callbacks.refresh(1, 300, path, user=admin)),
        "placement": (placement_layout.layout(), placement_callbacks.refresh(1, user=admin)),
        "recoveries": (
            recovery_layout.layout(),
            recovery_callbacks.refresh(1, None, 300, user=admin),
        ),
        "resources": (resource_layout.layout(), resource_callbacks.refresh(1, 300, user=admin)),
    }
    controls = {
        "overview": overview_callbacks.render_controls("/console/", user=admin),
        "job": job_callbacks.render_controls(path, user=admin),
        "placement": placement_callbacks.render_controls("/", user=admin),
    }
    for page, (layout, outputs) in pages.items():
        ids = _all_ids([layout, list(outputs), controls.get(page)])
        assert len(ids) == len(set(ids)), (page, sorted(i for i in ids if ids.count(i) > 1))


def test_start_with_kafka_topics_gives_the_job_a_kafka_source_and_sink(seeded, users, settings):
    settings.KAFKA_BOOTSTRAP_SERVERS = "127.0.0.1:9092"
    args = (1, "wc-kafka", "wordcount", "adaptive", 50, " lines ", "counts")
    overview_callbacks.start_clicked(*args, user=users[OPERATOR])
    job = Job.objects.get(name="wc-kafka")
    assert job.source == {"kind": "kafka", "topic": "lines"}
    assert job.sink == {"kind": "kafka", "topic": "counts"}
    refused = overview_callbacks.start_clicked(
        1, "wc-bad", "wordcount", "adaptive", 50, "no spaces allowed", "", user=users[OPERATOR]
    )
    assert "source.topic" in str(refused)
    assert not Job.objects.filter(name="wc-bad").exists()
