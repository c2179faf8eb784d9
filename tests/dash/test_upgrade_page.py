"""Upgrades on the job page: the upgrade control, the upgrade in progress with Confirm and Roll
back, the version history and the upgrade markers on the history figure.

Pure builders are checked without a database; the controls against the real upgrade service;
the page through its callbacks and the real Dash endpoint; and once in the system Chromium,
where an operator rolls an upgrade back by clicking.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.dash import controls
from console.dash.common import DEFAULT_WINDOW_S
from console.dash.controls import ActionRefused, RoleRefused
from console.dash.job import callbacks, figures, upgrades
from console.dash.job import layout as job_layout
from console.models import Job, JobUpgrade
from console.roles import ADMIN, OPERATOR, VIEWER
from console.services.upgrades import request_upgrade
from tests.dash import test_browser
from tests.dash.components import ids_in, text_of
from tests.dash.query_fleet import table_rows
from tests.dash.seed import seed_console, seed_upgraded_job
from tests.dash.test_browser import CHROMIUM, _log_in, _shoot
from tests.factories import make_job

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
UPDATE = "/django_plotly_dash/app/backstop-job/_dash-update-component"
# The browser test's fixtures: the system Chromium, and an operator and a viewer who log in.
browser = test_browser.browser
console_users = test_browser.console_users


def _row(**values) -> dict:
    """An upgrade row as console.dash.data.upgrade_rows returns it."""
    row = {
        "id": 7, "requested_at": NOW - timedelta(minutes=3), "requested_by": "otto",
        "from_topology": "activity@2", "to_topology": "activity@3", "from_params": {},
        "to_params": {"per_window.parallelism": "2"}, "mode": "blue_green", "case": "seeded",
        "reason": "the new version ran a batch on a copy of the running version's state",
        "status": "validating", "status_label": "new version writes; the old one stands by",
        "under_way": True, "requested_action": "", "stage": "per_window",
        "blue_replica": "per_window-2", "green_replica": "per_window-3", "checkpoint_batch": 342,
        "switched_at": NOW - timedelta(seconds=40), "ended_at": None, "ended_by": "",
        "outcome": "", "gap_s": None, "lost": None, "duplicates": None,
    }  # fmt: skip
    return {**row, **values}


def _ended(**values) -> dict:
    return _row(
        **{
            "id": 5, "from_topology": "activity@1", "to_topology": "activity@2",
            "to_params": {}, "case": "rebuild", "status": "confirmed", "under_way": False,
            "status_label": "confirmed", "checkpoint_batch": None,
            "switched_at": NOW - timedelta(minutes=12), "ended_at": NOW - timedelta(minutes=11),
            "outcome": "the new version wrote for 60 s without a failure", "gap_s": 0.4,
            "lost": 0, "duplicates": 1, **values,
        }
    )  # fmt: skip


# --- pure builders ------------------------------------------------------------------------------


def test_history_rows_say_what_changed_how_it_went_and_who_ended_it():
    rows = upgrades.upgrade_table_rows(
        [_row(requested_action="rollback", ended_by="olga"), _ended(ended_by="ada")], NOW
    )
    under_way, confirmed = ([text_of(cell) for cell in row] for row in rows)
    assert under_way[1:7] == [
        "otto",
        "activity@2 → activity@3 defaults → per_window.parallelism=2",
        "blue/green",
        "seeded",
        "validating",
        "342",
    ]
    assert under_way[-1] == "rollback asked by olga; the controller carries it out"
    assert confirmed[2] == "activity@1 → activity@2"
    assert confirmed[5:] == ["confirmed", "—", "11:48:00", "0.4", "0 / 1",
                             "ada : the new version wrote for 60 s without a failure"]  # fmt: skip
    # An upgrade the controller ended says so.
    assert text_of(upgrades.upgrade_table_rows([_ended()], NOW)[0][-1]).startswith("controller")
    assert table_rows(upgrades.upgrade_table([_row(), _ended()], NOW), "upgrades") == 2
    assert "not been upgraded" in text_of(upgrades.upgrade_table([], NOW))


def test_the_panel_shows_the_upgrade_under_way():
    rows = [_row(), _ended()]
    current = upgrades.under_way(rows)
    assert current["id"] == 7 and upgrades.under_way([_ended()]) is None
    text = " ".join(text_of(upgrades.upgrade_panel(current, NOW)).split())
    for words in (
        "Upgrade #7", "validating", "new version writes; the old one stands by",
        "activity@2 → activity@3 (per_window.parallelism=2)",
        "blue per_window-2 (activity@2)", "green per_window-3 (activity@3)",
        "Case: seeded — the new version ran a batch on a copy", "checkpoint batch 342",
        "requested 3 min ago by otto", "switched 40 s ago",
    ):  # fmt: skip
        assert words in text, words
    assert "results not checked" in text
    checked = {**current, "result_preserving": True, "results_compared": None}
    assert "no key compared yet" in text_of(upgrades.upgrade_panel(checked, NOW))
    checked.update(results_compared=212, results_differing=0)
    assert "equal on 212 keys" in text_of(upgrades.upgrade_panel(checked, NOW))
    checked.update(results_differing=3)
    assert "3 of 212 keys differ" in text_of(upgrades.upgrade_panel(checked, NOW))
    assert upgrades.upgrade_panel(None, NOW) is None
    assert upgrades.store_value(current) == {
        "id": 7, "status": "validating", "from": "activity@2", "to": "activity@3",
    }  # fmt: skip
    # Before the state check decided: no case yet, nothing switched.
    early = upgrades.upgrade_panel(_row(case="", reason="", switched_at=None), NOW)
    assert "not decided yet" in text_of(early)


def test_a_strategy_change_reads_as_one_in_place():
    change = _ended(
        from_topology="activity@2", to_topology="activity@2", from_strategy="adaptive",
        to_strategy="active-all", case="in_place", reason="same stages",
    )  # fmt: skip
    (row,) = upgrades.upgrade_table_rows([change], NOW)
    assert [text_of(cell) for cell in row][2:4] == ["strategy adaptive → active-all", "in place"]
    panel = text_of(upgrades.upgrade_panel({**change, "under_way": True}, NOW))
    assert "strategy adaptive → active-all · in place" in " ".join(panel.split())


def test_confirm_is_enabled_once_the_new_version_writes():
    assert callbacks.end_buttons({"id": 7, "status": "validating"}) == (False, False)
    assert callbacks.end_buttons({"id": 7, "status": "starting"}) == (True, False)
    assert callbacks.end_buttons(None) == (True, True)
    assert callbacks.end_buttons("forged") == (True, True)


def test_markers_mark_switches_and_rollbacks_inside_the_window():
    rolled_back = _row(
        id=6, status="rolled_back", under_way=False, switched_at=NOW - timedelta(minutes=8),
        ended_at=NOW - timedelta(minutes=7),
    )  # fmt: skip
    too_old = _ended(id=2, switched_at=NOW - timedelta(hours=2))
    never_switched = _row(id=8, status="refused", under_way=False, switched_at=None)
    markers = figures.upgrade_markers(
        [_row(), rolled_back, _ended(), too_old, never_switched], since=NOW - timedelta(minutes=15)
    )
    assert [(m["label"], m["kind"]) for m in markers] == [
        ("upgrade 5", "switch"),
        ("upgrade 6", "switch"),
        ("upgrade 6 rolled back", "rollback"),
        ("upgrade 7", "switch"),
    ]


def test_the_history_figure_draws_one_labelled_line_per_marker():
    frame = pd.DataFrame(
        {
            "at": pd.to_datetime([NOW - timedelta(minutes=m) for m in (10, 5, 0)], utc=True),
            "stage": ["count"] * 3,
            "name": ["priority"] * 3,
            "value": [0.5, 0.6, 0.55],
        }
    )
    markers = figures.upgrade_markers([_row(), _ended()], since=NOW - timedelta(minutes=15))
    fig = figures.history_figure(frame, ["count"], 0.4, markers)
    lines = [s for s in fig.layout.shapes if s.name and s.name.startswith("upgrade")]
    assert [(s.name, s.x0, s.yref, s.y0, s.y1) for s in lines] == [
        ("upgrade 5", NOW - timedelta(minutes=12), "paper", 0, 1),
        ("upgrade 7", NOW - timedelta(seconds=40), "paper", 0, 1),
    ]
    labels = [a.text for a in fig.layout.annotations]
    assert "upgrade 5" in labels and "upgrade 7" in labels
    # Without upgrades the figure is as before: only the threshold line.
    assert len(figures.history_figure(frame, ["count"], 0.4).layout.shapes) == 1


def test_params_lines_are_parsed_or_refused_naming_the_field_and_line():
    assert controls.parse_params("topn.n=3\n\n window_count.window_seconds = 20 \n") == {
        "topn.n": "3",
        "window_count.window_seconds": "20",
    }
    assert controls.parse_params(None) == controls.parse_params("") == {}
    for text, words in (
        ("topn.n", "params: line 1 ('topn.n'): expected OPERATOR.KEY=value"),
        ("topn.n=3\nn=4", "params: line 2 ('n=4')"),
        ("topn.n=", "params: line 1"),
        ("topn.n=3\ntopn.n=4", "params: line 2: topn.n is given twice"),
        (["topn.n=3"], "params: one OPERATOR.KEY=value a line"),
    ):
        with pytest.raises(ActionRefused) as refused:
            controls.parse_params(text)
        assert str(refused.value).startswith(words), refused.value


def test_the_confirm_step_names_the_version_and_parameters():
    shown, text = callbacks.ask_upgrade(1, "topn", "topn.n=3\n", [], "/console/jobs/4/")
    assert shown is True and text.startswith("Upgrade job #4 to topn with topn.n=3?")
    _, text = callbacks.ask_upgrade(1, "activity@3", "", ["yes"], "/console/jobs/4/")
    assert "to activity@3 with the version's own parameters" in text
    assert "checked against the running version's" in text
    store = {"id": 7, "status": "validating", "from": "activity@2", "to": "activity@3"}
    _, text = callbacks.ask_roll_back_upgrade(1, store)
    assert text.startswith("Roll upgrade #7 back to activity@2?")
    _, text = callbacks.ask_confirm_upgrade(1, store)
    assert text.startswith("Confirm upgrade #7 (activity@2 -> activity@3)?")


# --- the controls, against the upgrade service --------------------------------------------------


def _running_topn() -> Job:
    return make_job(Job.Status.RUNNING, topology="topn", name="tn")


def _path(job) -> str:
    return f"/console/jobs/{job.pk}/"


@pytest.mark.django_db
def test_an_operator_asks_for_an_upgrade_and_it_is_recorded(users):
    job = _running_topn()
    result = callbacks.upgrade_confirmed(
        1, "topn", "topn.n=3", ["yes"], _path(job), user=users[OPERATOR]
    )
    upgrade = JobUpgrade.objects.get(job=job)
    assert f"Upgrade #{upgrade.pk} requested: topn -> topn" in text_of(result)
    assert (upgrade.status, upgrade.to_topology, upgrade.to_params, upgrade.requested_by) == (
        "requested", "topn", {"topn.n": "3"}, users[OPERATOR],
    )  # fmt: skip
    assert upgrade.result_preserving


@pytest.mark.django_db
def test_a_viewer_may_not_upgrade_confirm_or_roll_back(users):
    job = _running_topn()
    with pytest.raises(RoleRefused, match="needs the operator role"):
        callbacks.upgrade_confirmed(1, "topn", "topn.n=3", [], _path(job), user=users[VIEWER])
    assert not JobUpgrade.objects.exists()
    upgrade = request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    JobUpgrade.objects.filter(pk=upgrade.pk).update(status=JobUpgrade.Status.VALIDATING)
    store = {"id": upgrade.pk, "status": "validating"}
    for end in (callbacks.confirm_upgrade_confirmed, callbacks.roll_back_confirmed):
        with pytest.raises(RoleRefused):
            end(1, store, user=users[VIEWER])
    upgrade.refresh_from_db()
    assert upgrade.requested_action == ""


@pytest.mark.django_db
@pytest.mark.parametrize(
    "version, params_text, words",
    [
        ("topn", "topn.n", "params: line 1 ('topn.n'): expected OPERATOR.KEY=value"),
        ("topn", "topn.k=3", "params: 'topn.k' is not a parameter of this job's operators"),
        ("topn@9", "", "topology: unknown topology 'topn@9'"),
        ("wordcount", "", "topology: 'wordcount' is not a version of the job's topology"),
        (["topn"], "", "topology: choose a version from the list"),
        ("topn", "", "nothing to change"),
    ],
)
def test_refused_upgrades_say_which_field_and_create_nothing(users, version, params_text, words):
    job = _running_topn()
    result = callbacks.upgrade_confirmed(
        1, version, params_text, [], _path(job), user=users[OPERATOR]
    )
    assert text_of(result).startswith("Not upgraded: ") and words in text_of(result)
    assert not JobUpgrade.objects.exists()


@pytest.mark.django_db
def test_confirm_and_roll_back_go_to_the_controller(users):
    job = _running_topn()
    upgrade = request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    JobUpgrade.objects.filter(pk=upgrade.pk).update(status=JobUpgrade.Status.STARTING)
    store = {"id": upgrade.pk, "status": "starting"}
    # Confirm waits for the switch: the service's refusal is shown.
    early = callbacks.confirm_upgrade_confirmed(1, store, user=users[OPERATOR])
    assert "Not confirmed" in text_of(early) and "once the new version writes" in text_of(early)
    JobUpgrade.objects.filter(pk=upgrade.pk).update(status=JobUpgrade.Status.VALIDATING)
    done = callbacks.confirm_upgrade_confirmed(1, store, user=users[OPERATOR])
    assert "confirm asked" in text_of(done)
    upgrade.refresh_from_db()
    assert (upgrade.requested_action, upgrade.ended_by) == ("confirm", users[OPERATOR])
    done = callbacks.roll_back_confirmed(1, store, user=users[ADMIN])
    assert "rollback asked" in text_of(done)
    upgrade.refresh_from_db()
    assert (upgrade.requested_action, upgrade.ended_by) == ("rollback", users[ADMIN])
    forged = callbacks.roll_back_confirmed(1, {"id": "x; drop"}, user=users[OPERATOR])
    assert text_of(forged) == "Not rolled back: no such upgrade"


@pytest.mark.django_db
def test_a_rollback_before_anything_started_cancels_it(users):
    job = _running_topn()
    upgrade = request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    done = callbacks.roll_back_confirmed(1, {"id": upgrade.pk}, user=users[OPERATOR])
    assert "cancelled before it started" in text_of(done)
    assert JobUpgrade.objects.get(pk=upgrade.pk).status == "abandoned"


# --- the page -----------------------------------------------------------------------------------


@pytest.fixture
def upgraded(db, users):
    return seed_upgraded_job(seed_console(minutes=20), requested_by=users[OPERATOR])


@pytest.mark.django_db
def test_the_refresh_shows_the_upgrade_under_way_the_history_and_the_markers(upgraded, users):
    outputs = callbacks.refresh(1, DEFAULT_WINDOW_S, _path(upgraded.job), user=users[VIEWER])
    history, hidden, panel, store, table = outputs[5], *outputs[9:13]
    assert hidden is False
    assert "validating" in text_of(panel) and "activity@2 → activity@3" in text_of(panel)
    assert store["id"] == upgraded.validating.pk and store["status"] == "validating"
    assert table_rows(table, "upgrades") == 2
    assert "activity@1 → activity@2" in text_of(table) and "confirmed" in text_of(table)
    labels = {a.text for a in history.layout.annotations}
    assert {f"upgrade {upgraded.confirmed.pk}", f"upgrade {upgraded.validating.pk}"} <= labels

    # Once it ended, the panel goes and the store empties: the buttons disable themselves.
    JobUpgrade.objects.filter(pk=upgraded.validating.pk).update(status="confirmed")
    outputs = callbacks.refresh(1, DEFAULT_WINDOW_S, _path(upgraded.job), user=users[VIEWER])
    assert outputs[9:12] == (True, None, None)


@pytest.mark.django_db
def test_one_query_for_the_upgrades_however_many(upgraded, users):
    def count() -> int:
        path = _path(upgraded.job)
        callbacks.refresh(1, DEFAULT_WINDOW_S, path, user=users[VIEWER])  # warm up
        with CaptureQueriesContext(connection) as captured:
            callbacks.refresh(1, DEFAULT_WINDOW_S, path, user=users[VIEWER])
        return len(captured.captured_queries)

    with_two = count()
    for index in range(10):
        JobUpgrade.objects.create(
            job=upgraded.job, requested_by=users[ADMIN], ended_by=users[OPERATOR],
            from_topology="activity@1", to_topology="activity@2", status="rolled_back",
            switched_at=upgraded.now - timedelta(minutes=index), ended_at=upgraded.now,
        )  # fmt: skip
    assert count() == with_two


@pytest.mark.django_db
def test_operators_get_the_controls_and_viewers_nothing(upgraded, users):
    path = _path(upgraded.job)
    assert callbacks.render_controls(path, user=users[VIEWER]) is None
    assert callbacks.render_upgrade_actions(path, user=users[VIEWER]) is None
    rendered = callbacks.render_controls(path, user=users[OPERATOR])
    version = _find(rendered, "upgrade-version")
    assert [o["value"] for o in version.options] == ["activity@1", "activity@2", "activity@3"]
    assert version.value == "activity@3"
    assert "activity@3 (running)" in [o["label"] for o in version.options]
    assert {"upgrade-params", "upgrade-button", "upgrade-confirm"} <= ids_in(rendered)
    actions = callbacks.render_upgrade_actions(path, user=users[OPERATOR])
    assert {"upgrade-confirm-button", "upgrade-rollback-button"} <= ids_in(actions)
    # Every id once, with everything filled in.
    tree = [
        job_layout.layout(),
        list(callbacks.refresh(1, DEFAULT_WINDOW_S, path, user=users[ADMIN])),
        rendered,
        actions,
    ]
    ids = _all_ids(tree)
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.django_db
def test_an_operator_changes_the_strategy_from_the_controls(users):
    job = _running_topn()
    rendered = callbacks.render_controls(_path(job), user=users[OPERATOR])
    choice = _find(rendered, "strategy-choice")
    assert choice.value == "adaptive" and "adaptive (running)" in [o["label"] for o in
                                                                   choice.options]  # fmt: skip
    shown, text = callbacks.ask_strategy(1, "active-all", _path(job))
    assert shown and text.startswith(f"Protect job #{job.pk} by active-all from now on?")
    with pytest.raises(RoleRefused):
        callbacks.strategy_confirmed(1, "active-all", _path(job), user=users[VIEWER])
    refused = callbacks.strategy_confirmed(1, "adaptive", _path(job), user=users[OPERATOR])
    assert text_of(refused).startswith("Not changed: nothing to change")
    assert "strategy: choose" in text_of(
        callbacks.strategy_confirmed(1, ["x"], _path(job), user=users[OPERATOR])
    )
    assert not JobUpgrade.objects.exists()
    result = callbacks.strategy_confirmed(1, "active-all", _path(job), user=users[OPERATOR])
    upgrade = JobUpgrade.objects.get(job=job)
    assert f"Upgrade #{upgrade.pk} requested: strategy adaptive -> active-all" in text_of(result)
    assert (upgrade.from_strategy, upgrade.to_strategy, upgrade.requested_by) == (
        "adaptive", "active-all", users[OPERATOR],
    )  # fmt: skip


@pytest.mark.django_db
def test_the_params_box_holds_the_parameters_in_force(users):
    job = _running_topn()
    upgrade = request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    JobUpgrade.objects.filter(pk=upgrade.pk).update(status="confirmed", ended_at=NOW)
    rendered = callbacks.render_controls(_path(job), user=users[OPERATOR])
    assert _find(rendered, "upgrade-params").value == "topn.n=3"
    assert _find(rendered, "upgrade-version").value == "topn"


def _find(component, component_id: str):
    if isinstance(component, list | tuple):
        return next((f for c in component if (f := _find(c, component_id)) is not None), None)
    if getattr(component, "id", None) == component_id:
        return component
    children = getattr(component, "children", None)
    return None if children is None or isinstance(children, str) else _find(children, component_id)


def _all_ids(component) -> list[str]:
    if isinstance(component, list | tuple):
        return [i for child in component for i in _all_ids(child)]
    if component is None or isinstance(component, str | int | float | bool | dict):
        return []
    own = [component.id] if isinstance(getattr(component, "id", None), str) else []
    return own + _all_ids(getattr(component, "children", None))


def _update(client, output: str, inputs: list, state: list) -> object:
    body = {
        "output": output,
        "outputs": {"id": output.split(".")[0], "property": output.split(".")[1]},
        "inputs": inputs,
        "state": state,
        "changedPropIds": [f"{inputs[0]['id']}.{inputs[0]['property']}"],
    }
    return client.post(UPDATE, json.dumps(body), content_type="application/json")


@pytest.mark.django_db
def test_the_dash_endpoint_refuses_a_viewer_and_shows_refusals_as_messages(client, upgraded, users):
    store = {"id": upgraded.validating.pk, "status": "validating"}
    rollback = (
        "upgrade-rollback-result.children",
        [{"id": "upgrade-rollback-dialog", "property": "submit_n_clicks", "value": 1}],
        [{"id": "upgrade-under-way", "property": "data", "value": store}],
    )
    client.force_login(users[VIEWER])
    assert _update(client, *rollback).status_code == 403
    assert JobUpgrade.objects.get(pk=upgraded.validating.pk).requested_action == ""

    client.force_login(users[OPERATOR])
    response = _update(client, *rollback)
    assert response.status_code == 200 and "rollback asked" in response.content.decode()
    assert JobUpgrade.objects.get(pk=upgraded.validating.pk).requested_action == "rollback"

    # A refused request: a message naming the field in the page, not a traceback (a 500).
    upgrade = (
        "upgrade-result.children",
        [{"id": "upgrade-confirm", "property": "submit_n_clicks", "value": 1}],
        [
            {"id": "upgrade-version", "property": "value", "value": "activity@3"},
            {"id": "upgrade-params", "property": "value", "value": "no equals sign"},
            {"id": "upgrade-result-preserving", "property": "value", "value": []},
            {"id": "url", "property": "pathname", "value": _path(upgraded.job)},
        ],
    )
    response = _update(client, *upgrade)
    assert response.status_code == 200
    assert "Not upgraded: params: line 1" in response.content.decode()
    assert JobUpgrade.objects.count() == 2


# --- in the browser -----------------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs the system Chromium at /usr/bin/chromium")
def test_an_operator_sees_the_upgrade_and_rolls_it_back(
    live_server, browser, console_users, transactional_db
):
    from playwright.sync_api import expect

    seeded = seed_upgraded_job(seed_console(), requested_by=console_users[OPERATOR])
    upgrade = seeded.validating
    page = _log_in(browser, live_server.url, "olga")
    page.goto(f"{live_server.url}/console/jobs/{seeded.job.pk}/")

    panel = page.locator("#upgrade-card")
    expect(panel).to_be_visible()
    expect(panel).to_contain_text(f"Upgrade #{upgrade.pk}")
    expect(panel).to_contain_text("validating")
    expect(panel).to_contain_text("activity@2 → activity@3 (per_window.parallelism=2)")
    expect(panel).to_contain_text("per_window-3")
    history = page.locator("#upgrades")
    expect(history).to_contain_text("activity@1 → activity@2")
    expect(history).to_contain_text("confirmed")
    expect(page.locator("#history")).to_contain_text(f"upgrade {seeded.confirmed.pk}")
    expect(page.locator("#upgrade-version")).to_contain_text("activity@3 (running)")
    # Validating: Confirm is enabled too.
    expect(page.locator("#upgrade-confirm-button")).to_be_enabled()

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#upgrade-rollback-button")
    expect(page.locator("#upgrade-rollback-result")).to_contain_text("rollback asked")
    assert JobUpgrade.objects.get(pk=upgrade.pk).requested_action == "rollback"
    expect(panel).to_contain_text("rollback asked by olga")

    _shoot(page, "job-upgrade")


def test_an_apps_upgrade_reads_as_a_stop_and_restart_of_its_one_replica():
    app = _row(
        from_topology="windows@1", to_topology="windows@2", to_params={}, mode="blue_green",
        case="app_restart", stage="job", blue_replica="job-1", green_replica="job-1",
        status="validating",
        status_label=JobUpgrade(case="app_restart", status="validating").status_label,
    )  # fmt: skip
    text = " ".join(text_of(upgrades.upgrade_panel(app, NOW)).split())
    assert "windows@1 → windows@2 · stop and restart" in text
    assert "replica job-1" in text and "blue" not in text and "green" not in text
    assert "the old one stands by" not in text
    assert "confirmed once each query completes a batch" in text
    (row,) = upgrades.upgrade_table_rows([app], NOW)
    assert text_of(row[3]) == "stop and restart"
    # Backstop's own jobs keep the general labels.
    own = JobUpgrade(case="seeded", status="validating")
    assert own.status_label == "new version writes; the old one stands by"
    stopping = JobUpgrade(case="app_restart", status="switching")
    assert stopping.status_label.startswith("the app's queries stopping")
