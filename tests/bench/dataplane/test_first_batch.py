"""The first-batch benchmark's table (bench.dataplane.first_batch): each variant's runs, their
median and Spark's durations. The benchmark itself starts real Spark processes; its figures are
in docs/RESULTS.md ("A spare's first batch")."""

import argparse

from bench.dataplane.first_batch import table


def test_the_table_gives_each_variant_its_runs_and_median():
    def run(variant, first_s, add_ms):
        durations = {"queryPlanning": 40, "addBatch": add_ms}
        return {"variant": variant, "first_batch_s": first_s, "durations": durations}

    results = [run("spare", 2.5, 1800), run("plan", 1.0, 400), run("spare", 2.3, 1700),
               run("plan", 0.9, 500), run("spare", 2.4, 1750)]  # fmt: skip
    lines = table(argparse.Namespace(topology="wordcount", runs=3), results).splitlines()
    assert lines[0].startswith("Command: `python -m bench.dataplane.first_batch --topology ")
    spare = next(line for line in lines if line.startswith("| a warm spare"))
    plan = next(line for line in lines if line.startswith("| and the stage's plan"))
    assert spare.endswith("| 2.50, 2.30, 2.40 | 2.40 | 40 | 1750 |")
    assert plan.endswith("| 1.00, 0.90 | 0.95 | 40 | 450 |")
