"""Page data shared by every viewer (console.services.shared_data, console.dash.sharing, the API's
shared reads), against the real Redis cache and the real Dash endpoints.

- many requests at once compute once; the value is recomputed once it is older than the
  interval; an answer that may not be shared (an error) is not;
- a second viewer's job-page refresh runs no query of the page's data and gets the first one's
  answer, whatever its refresh count; other inputs (another window) are computed on their own;
- an operator's action, in the console or through the API, shows on the next refresh;
- the API's hot reads are shared the same way and say their data's age.
"""

import json
import threading
import time
from datetime import UTC, datetime

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from console.dash import controls
from console.dash.job.app import REFRESH_OUTPUTS
from console.dash.sharing import DATA_AGE
from console.models import Job
from console.roles import OPERATOR, VIEWER
from console.services.shared_data import entry_key, invalidate_all, shared
from infra import keys
from tests.dash.seed import seed_console
from tests.factories import UserFactory

UPDATE = "/django_plotly_dash/app/backstop-job/_dash-update-component"
# The tables every authenticated request reads (session, user); anything else is page data.
AUTH_TABLES = ("django_session", "auth_user", "authtoken_token")


def data_queries(captured) -> list[str]:
    return [
        q["sql"] for q in captured.captured_queries if not any(t in q["sql"] for t in AUTH_TABLES)
    ]


# -- the shared value itself ------------------------------------------------------------------


def test_many_requests_at_once_compute_once(db):
    computed = []

    def compute():
        computed.append(1)
        time.sleep(0.3)  # long enough that every thread arrives while it runs
        return {"answer": 42}

    key = entry_key("test", ["at-once"])
    results = []

    def ask():
        results.append(shared(key, 2.0, compute))

    threads = [threading.Thread(target=ask) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(computed) == 1
    assert [r.value for r in results] == [{"answer": 42}] * 20
    assert sum(r.computed_here for r in results) == 1
    assert len({r.computed_at for r in results}) == 1


def test_a_request_delayed_between_its_read_and_its_mark_computes_nothing(db, monkeypatch):
    """The race behind a CI failure: this request reads (nothing yet), then, before it takes the
    computing mark, another request computes, stores and drops its mark. The value it stored is
    fresh, so this one must return it instead of computing a second time."""
    from console.services import shared_data

    computed = []
    key = entry_key("test", ["delayed-read"])
    real_read = shared_data._read
    delayed = {"first": True}

    def read_then_let_another_request_finish(read_key):
        answer = real_read(read_key)
        if delayed.pop("first", False):
            other = threading.Thread(target=lambda: shared(key, 5.0, lambda: computed.append(1)))
            other.start()
            other.join()
        return answer

    monkeypatch.setattr(shared_data, "_read", read_then_let_another_request_finish)
    answer = shared(key, 5.0, lambda: computed.append(2))
    assert computed == [1]
    assert not answer.computed_here


def test_a_value_older_than_its_interval_is_computed_again(db):
    values = iter(range(10))
    key = entry_key("test", ["again"])
    first = shared(key, 0.2, lambda: next(values))
    assert shared(key, 0.2, lambda: next(values)).value == first.value == 0
    time.sleep(0.25)
    assert shared(key, 0.2, lambda: next(values)).value == 1


def test_while_one_request_computes_the_others_get_the_previous_value_at_once(db):
    key = entry_key("test", ["stale-while-computing"])
    assert shared(key, 0.1, lambda: "old").value == "old"
    time.sleep(0.15)  # stale now
    computing = threading.Event()

    def slow():
        computing.set()
        time.sleep(0.6)
        return "new"

    worker = threading.Thread(target=lambda: shared(key, 0.1, slow))
    worker.start()
    computing.wait(5)
    started = time.monotonic()
    answer = shared(key, 0.1, lambda: pytest.fail("a second computation"))
    waited = time.monotonic() - started
    worker.join()
    assert answer.value == "old" and not answer.computed_here
    assert waited < 0.3, f"waited {waited:.2f} s for the other computation"
    assert shared(key, 5.0, lambda: pytest.fail("computed again")).value == "new"


def test_an_answer_that_may_not_be_shared_is_computed_for_each_request(db):
    values = iter(range(10))
    key = entry_key("test", ["errors"])
    answers = [shared(key, 5.0, lambda: next(values), keep=lambda v: False).value for _ in "abc"]
    assert answers == [0, 1, 2]


def test_invalidating_starts_every_entry_again(db):
    values = iter(range(10))
    key = entry_key("test", ["invalidate"])
    assert shared(key, 60.0, lambda: next(values)).value == 0
    invalidate_all()
    assert shared(key, 60.0, lambda: next(values)).value == 1
    assert shared(key, 60.0, lambda: next(values)).value == 1


# -- the job page's refresh -------------------------------------------------------------------


def refresh_body(job_id: int, n_intervals: int, window_s: int = 900) -> str:
    outputs = [*REFRESH_OUTPUTS, DATA_AGE]
    return json.dumps(
        {
            "output": ".." + "...".join(f"{i}.{p}" for i, p in outputs) + "..",
            "outputs": [{"id": i, "property": p} for i, p in outputs],
            "inputs": [
                {"id": "refresh", "property": "n_intervals", "value": n_intervals},
                {"id": "window", "property": "value", "value": window_s},
                {"id": "url", "property": "pathname", "value": f"/console/jobs/{job_id}/"},
            ],
            "changedPropIds": ["refresh.n_intervals"],
        }
    )


def viewer_client(username: str, role: str = VIEWER) -> tuple[Client, str]:
    client = Client(enforce_csrf_checks=True)
    client.force_login(UserFactory(username=username, role=role))
    assert client.get("/console/").status_code == 200
    return client, client.cookies[settings.CSRF_COOKIE_NAME].value


def refresh(client, token, job_id, n_intervals, window_s=900):
    return client.post(
        UPDATE,
        refresh_body(job_id, n_intervals, window_s),
        content_type="application/json",
        HTTP_X_CSRFTOKEN=token,
    )


def status_shown(response) -> str:
    summary = response.json()["response"]["summary"]["children"]
    return json.dumps(summary)


@pytest.fixture
def seeded(db):
    return seed_console(minutes=2)


def test_a_second_viewer_gets_the_first_ones_answer_without_a_query(seeded):
    job = seeded.adaptive
    first_client, first_token = viewer_client("vic")
    second_client, second_token = viewer_client("val")
    with CaptureQueriesContext(connection) as first_queries:
        first = refresh(first_client, first_token, job.pk, n_intervals=7)
    assert first.status_code == 200
    assert data_queries(first_queries), "the first refresh reads the page's data"
    with CaptureQueriesContext(connection) as second_queries:
        second = refresh(second_client, second_token, job.pk, n_intervals=1)
    assert second.status_code == 200
    assert data_queries(second_queries) == []
    assert second.content == first.content
    assert second["X-Data-Computed-At"] == first["X-Data-Computed-At"]
    # The page says when its data was read: after the shared computation began, before now.
    as_of = first.json()["response"]["data-age"]["children"]["props"]["data-as-of"]
    started = datetime.fromisoformat(first["X-Data-Computed-At"])
    started = started.replace(microsecond=started.microsecond // 1000 * 1000)  # as the page
    assert started <= datetime.fromisoformat(as_of) <= datetime.now(UTC)
    assert "running" in status_shown(first)


def test_other_inputs_are_computed_on_their_own(seeded):
    client, token = viewer_client("vic")
    with CaptureQueriesContext(connection):
        refresh(client, token, seeded.adaptive.pk, 1, window_s=900)
    with CaptureQueriesContext(connection) as other_window:
        refresh(client, token, seeded.adaptive.pk, 2, window_s=3600)
    with CaptureQueriesContext(connection) as other_job:
        refresh(client, token, seeded.baseline.pk, 3, window_s=900)
    assert data_queries(other_window) and data_queries(other_job)


def test_an_operators_stop_shows_on_the_next_refresh(seeded):
    job = seeded.adaptive
    client, token = viewer_client("vic")
    assert "running" in status_shown(refresh(client, token, job.pk, 1))
    operator = UserFactory(username="olga", role=OPERATOR)
    controls.stop_job(operator, job.pk)
    assert Job.objects.get(pk=job.pk).status != Job.Status.RUNNING
    shown = status_shown(refresh(client, token, job.pk, 2))
    assert "running" not in shown
    assert Job.objects.get(pk=job.pk).status in shown


# -- the API's hot reads ----------------------------------------------------------------------


def test_the_job_list_is_shared_and_says_its_age(seeded, api_as):
    viewer = api_as(VIEWER)
    first = viewer.get("/api/jobs/")
    assert first.status_code == 200
    with CaptureQueriesContext(connection) as again:
        second = api_as(VIEWER).get("/api/jobs/")
    assert data_queries(again) == []
    assert second.json() == first.json()
    assert 0 <= int(second["Age"]) <= 2
    names = {row["name"] for row in second.json()["results"]}
    assert {seeded.adaptive.name, seeded.baseline.name} <= names


def test_an_api_write_shows_on_the_next_read(seeded, api_as):
    job = seeded.adaptive
    viewer = api_as(VIEWER)
    assert viewer.get(f"/api/jobs/{job.pk}/").json()["status"] == Job.Status.RUNNING
    stopped = api_as(OPERATOR).post(f"/api/jobs/{job.pk}/stop/")
    assert stopped.status_code in (200, 202)
    now_shown = viewer.get(f"/api/jobs/{job.pk}/").json()["status"]
    assert now_shown == Job.objects.get(pk=job.pk).status != Job.Status.RUNNING


# -- what a hand-made refresh can store (issue 58) ------------------------------------------------


def shared_dash_entries() -> list[bytes]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    found = client.keys(keys.shared_data("dash", "*"))
    return [key for key in found if not key.endswith(b":computing")]


def test_made_up_inputs_of_a_refresh_are_refused_and_store_nothing(seeded):
    """Dash passes a callback's inputs by position, whatever ids a request gives them: keyed by
    the ids and values a request sends, renamed inputs or another timer id made a new entry per
    request for the same answer. Now the request must name the callback's inputs."""
    client, token = viewer_client("vic")
    job_id = seeded.adaptive.pk
    for n in range(25):
        body = json.loads(refresh_body(job_id, n_intervals=n))
        body["inputs"][1]["id"] = f"junk-{n}"  # the window, renamed
        answer = client.post(
            UPDATE, json.dumps(body), content_type="application/json", HTTP_X_CSRFTOKEN=token
        )
        assert answer.status_code == 400, answer.content
        assert "inputs" in answer.json()["error"]["detail"]
    for n in range(25):
        body = json.loads(refresh_body(job_id, n_intervals=n))
        body["inputs"].append({"id": f"junk-{n}", "property": "value", "value": n})
        answer = client.post(
            UPDATE, json.dumps(body), content_type="application/json", HTTP_X_CSRFTOKEN=token
        )
        assert answer.status_code == 400, answer.content
    assert shared_dash_entries() == []
    assert refresh(client, token, job_id, 1).status_code == 200
    assert len(shared_dash_entries()) == 1


def test_only_the_offered_windows_are_computed_and_stored(seeded):
    client, token = viewer_client("vic")
    for n in range(20):
        answer = refresh(client, token, seeded.adaptive.pk, n, window_s=901 + n)
        assert answer.status_code == 400, answer.content
        assert "window.value" in answer.json()["error"]["detail"]
    assert shared_dash_entries() == []
    assert refresh(client, token, seeded.adaptive.pk, 1, window_s=3600).status_code == 200
    assert len(shared_dash_entries()) == 1


def test_a_shared_page_entry_is_json(seeded):
    client, token = viewer_client("vic")
    answer = refresh(client, token, seeded.adaptive.pk, 1)
    (key,) = shared_dash_entries()
    _generation, _computed_at, value, _stored_at = json.loads(
        redis.Redis.from_url(settings.REDIS_URL).get(key)
    )
    status, content, content_type = value
    assert status == 200 and content_type.startswith("application/json")
    assert content.encode() == answer.content
