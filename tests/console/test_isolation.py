"""Issue 58, isolation: what a viewer can put into the shared Redis, and what the stage
processes (users' job code, given that Redis's URL) can read or plant there. Against the real
Redis of the test settings and the real test database.

- shared API reads are keyed by the query parameters the view knows, normalised: made-up ones
  add no entry;
- the API throttles each user (429, JSON);
- the shared entries and the Django cache hold JSON, and a pickle planted there is never run;
- sessions live in the database only.
"""

import json
import pickle
import time

import pytest
import redis
from django.conf import settings
from django.contrib.sessions.models import Session
from django.core.cache import cache
from django.test import Client, override_settings

from console.roles import VIEWER
from infra import keys
from tests.factories import UserFactory, make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def raw_redis():
    return redis.Redis.from_url(settings.REDIS_URL)


def api_entries(client: redis.Redis) -> list[bytes]:
    """The shared API entries in Redis (not their short-lived computing marks)."""
    found = client.keys(keys.shared_data("api", "*"))
    return [key for key in found if not key.endswith(b":computing")]


# -- cache keys of the shared reads -------------------------------------------------------------


def test_made_up_query_parameters_add_no_shared_entry(api_as, raw_redis):
    make_job(name="isolated")
    viewer = api_as(VIEWER)
    answers = [viewer.get(f"/api/jobs/?junk={n}&limit=10") for n in range(50)]
    assert {a.status_code for a in answers} == {200}
    assert all(a.json() == answers[0].json() for a in answers)
    assert len(api_entries(raw_redis)) == 1


def test_the_key_is_normalised_and_known_parameters_still_count(api_as, raw_redis):
    make_job(name="isolated")
    viewer = api_as(VIEWER)
    same = ("status=running,failed", "status=failed&status=running", "status=failed,running,")
    for query in same:
        assert viewer.get(f"/api/jobs/?{query}").status_code == 200
    assert len(api_entries(raw_redis)) == 1
    assert viewer.get("/api/jobs/").status_code == 200
    assert viewer.get("/api/jobs/?limit=5").status_code == 200
    assert len(api_entries(raw_redis)) == 3
    # A bad value is a 400 naming the parameter, and nothing is stored for it.
    refused = viewer.get("/api/jobs/?status=bogus")
    assert refused.status_code == 400
    assert "status" in refused.json()["error"]["detail"]
    assert len(api_entries(raw_redis)) == 3


# -- throttling ---------------------------------------------------------------------------------


@override_settings(API_THROTTLE_RATES={"user": "3/min", "anon": "3/min"})
def test_a_user_over_the_rate_gets_a_json_429_and_others_do_not(api_as, users):
    viewer = api_as(VIEWER)
    codes = [viewer.get("/api/fleet/").status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    refused = viewer.get("/api/fleet/")
    assert refused.status_code == 429
    assert refused["Content-Type"].startswith("application/json")
    error = refused.json()["error"]
    assert error["status"] == 429 and error["code"] == "throttled"
    assert 0 < int(refused["Retry-After"]) <= 60
    other = UserFactory(username="vic", role=VIEWER)
    client = api_as(VIEWER)
    client.force_authenticate(other)
    assert client.get("/api/fleet/").status_code == 200


# -- JSON, never pickle -------------------------------------------------------------------------


def test_a_shared_entry_in_redis_is_json(api_as, raw_redis):
    make_job(name="isolated")
    answer = api_as(VIEWER).get("/api/jobs/")
    assert answer.status_code == 200
    (key,) = api_entries(raw_redis)
    raw = raw_redis.get(key)
    assert not raw.startswith(b"\x80"), "a pickle"
    generation, computed_at, (status, data), stored_at = json.loads(raw)
    assert status == 200
    assert data["count"] == answer.json()["count"] == 1
    assert computed_at <= stored_at <= time.time()


def test_the_django_cache_stores_json(raw_redis):
    cache.set("isolation-probe", {"ids": [1, 2], "name": "x"}, 30)
    raw = raw_redis.get(cache.make_key("isolation-probe"))
    assert json.loads(raw) == {"ids": [1, 2], "name": "x"}
    assert cache.get("isolation-probe") == {"ids": [1, 2], "name": "x"}
    cache.set("isolation-count", 1, 30)
    assert cache.incr("isolation-count") == 2  # integers stay Redis integers


PLANTED = []


def planted_code_ran():
    """What a pickle planted by a job would call when the console unpickled it."""
    PLANTED.append("ran")
    return [0, time.time(), [200, {"forged": True}], time.time()]


class Planted:
    def __reduce__(self):
        return (planted_code_ran, ())


def test_a_pickle_planted_in_a_shared_entry_is_never_run(api_as, raw_redis):
    viewer = api_as(VIEWER)
    assert viewer.get("/api/fleet/").status_code == 200
    (key,) = api_entries(raw_redis)
    raw_redis.set(key, pickle.dumps(Planted()))
    answer = viewer.get("/api/fleet/")
    assert PLANTED == []
    assert answer.status_code == 200 and "forged" not in answer.json()
    assert json.loads(raw_redis.get(key))[2][0] == 200  # recomputed, as JSON


# -- sessions -----------------------------------------------------------------------------------


def test_sessions_are_in_the_database_and_not_in_redis(users, raw_redis):
    client = Client()
    client.force_login(users[VIEWER])
    assert client.get("/console/").status_code == 200
    session_key = client.cookies[settings.SESSION_COOKIE_NAME].value
    assert Session.objects.filter(session_key=session_key).exists()
    everything = raw_redis.keys("*")
    assert not [k for k in everything if b"session" in k.lower()], everything
    assert not [k for k in everything if session_key.encode() in k]
