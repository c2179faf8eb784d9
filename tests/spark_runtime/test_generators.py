"""The seeded input generator (real Redis): a generator started again resumes, so a repeated
start (the controller reconciles the job's input every cycle) never duplicates input."""

from __future__ import annotations

from spark_runtime import generators, keys


def test_a_resumed_generator_goes_on_after_the_entries_already_written(client, job):
    assert generators.generate(client, job, "wordcount", count=40, rate=1e6, seed=3) == 40
    # Started again for the same target of 100 entries: it writes only the 60 missing ones.
    wrote = generators.generate(client, job, "wordcount", count=100, rate=1e6, seed=3, resume=True)
    assert wrote == 60
    again = generators.generate(client, job, "wordcount", count=100, rate=1e6, seed=3, resume=True)
    assert again == 0
    ids = [fields["id"] for _, fields in client.xrange(keys.input_stream(job))]
    assert ids == [f"e{n}" for n in range(100)]
