"""Which stage plans a warm spare warms up (spark_runtime/spare_plans.py): pure choices, and
their record in a real Redis. The warm-up itself runs in tests/spark_runtime/test_topologies.py."""

from __future__ import annotations

import json

from spark_runtime import keys
from spark_runtime.spare_plans import (
    MAX_WARM_PLANS,
    PLAN_TTL_S,
    plans_to_warm,
    publish_plans,
    stage_plans,
    stale_jobs,
    withdraw_plans,
)


def plan(topology, stage, operators=("op",), params=()):
    return {"topology": topology, "stage": stage, "operators": list(operators),
            "params": list(params)}  # fmt: skip


def entry(plans, at):
    return json.dumps({"plans": plans, "at": at})


def test_stage_plans_put_the_stages_with_a_standby_first():
    plans = stage_plans(
        "topn", {"window_count": ["window_count"], "topn": ["topn"]}, ["topn.n=3"], {"topn"}
    )
    assert plans == [
        plan("topn", "topn", ["topn"], ["topn.n=3"]),
        plan("topn", "window_count", ["window_count"], ["topn.n=3"]),
    ]


def test_plans_to_warm_newest_job_first_once_per_plan_and_bounded():
    now = 10_000.0
    raw = {
        "old": entry([plan("wordcount", "all")], now - 50),
        "new": entry([plan("topn", "topn"), plan("wordcount", "all")], now - 1),
        b"stale": entry([plan("traffic", "join")], now - PLAN_TTL_S - 1),
        "broken": "{not json",
        "odd": json.dumps({"plans": []}),
    }
    chosen = plans_to_warm(raw, now)
    assert [(p["job"], p["topology"]) for p in chosen] == [("new", "topn"), ("new", "wordcount")]
    assert sorted(map(str, stale_jobs(raw, now))) == ["b'stale'", "broken", "odd"]
    # Another parameter makes another plan; the bound holds.
    many = {f"j{i}": entry([plan("topn", "topn", params=[f"topn.n={i}"])], now) for i in range(9)}
    assert len(plans_to_warm(many, now)) == MAX_WARM_PLANS
    assert len({p["params"][0] for p in plans_to_warm(many, now)}) == MAX_WARM_PLANS


def test_plans_are_published_per_job_and_withdrawn(redis_conn, job):
    publish_plans(redis_conn, job, [plan("wordcount", "all")], now=123.0)
    publish_plans(redis_conn, job, [plan("wordcount", "all")], now=124.0)  # renewed, not added
    raw = redis_conn.hgetall(keys.spare_plans())
    assert json.loads(raw[job]) == {"plans": [plan("wordcount", "all")], "at": 124.0}
    assert plans_to_warm({job: raw[job]}, 124.0) == [{**plan("wordcount", "all"), "job": job}]
    withdraw_plans(redis_conn, job)
    assert not redis_conn.hexists(keys.spare_plans(), job)
