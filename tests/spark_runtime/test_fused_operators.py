"""Which operators run as one (spark_runtime.topology.FUSED_OPERATORS) and the plans that run them
(spark_runtime.pipelines.FUSED_PLANS) name the same operators: the topology decides the stages
from the first, a stage builds its query from the second."""

from spark_runtime.pipelines import FUSED_PLANS, fused_plan
from spark_runtime.topology import FUSED_OPERATORS, get_topology


def test_every_fused_operator_sequence_has_its_plan_and_no_other_plan_exists():
    assert set(FUSED_PLANS) == set(FUSED_OPERATORS)


def test_topn_runs_its_count_and_ranking_as_one_plan_and_wordcount_does_not():
    topn = get_topology("topn")
    assert (
        fused_plan(topn, ("window_count", "topn"))
        is FUSED_PLANS[("topn", ("window_count", "topn"))]
    )
    assert fused_plan(topn, ("window_count",)) is None
    wordcount = get_topology("wordcount")
    assert fused_plan(wordcount, ("split", "count")) is None
