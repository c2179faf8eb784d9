"""The benchmark's resource sampler: steady means from known samples."""

from bench.strategy.harness import ResourceSampler


def sampler_with(samples):
    """A sampler holding `samples` (time, CPU %, RSS MiB, PSS MiB or None), its thread unused."""
    return ResourceSampler(find_processes=list, samples=list(samples))


def test_means_cover_the_window_after_its_first_two_seconds():
    sampler = sampler_with([
        (100.0, 0.0, 900.0, 500.0),  # a new process's first reading: skipped
        (102.0, 50.0, 1000.0, 600.0),
        (103.0, 70.0, 1100.0, 700.0),
        (104.0, 60.0, 1200.0, 800.0),
        (110.0, 99.0, 9999.0, 9999.0),  # at the end of the window: not in it
    ])  # fmt: skip
    assert sampler.mean_between(100.0, 110.0) == (60.0, 1100.0, 700.0)


def test_pss_means_the_samples_that_read_one():
    sampler = sampler_with([(102.0, 10.0, 100.0, 40.0), (103.0, 20.0, 200.0, None)])
    assert sampler.mean_between(100.0, 110.0) == (15.0, 150.0, 40.0)
    # A platform without PSS: CPU and RSS as before, no PSS.
    sampler = sampler_with([(102.0, 10.0, 100.0, None), (103.0, 20.0, 200.0, None)])
    assert sampler.mean_between(100.0, 110.0) == (15.0, 150.0, None)


def test_a_window_without_samples_has_no_figures():
    sampler = sampler_with([(101.0, 10.0, 100.0, 40.0)])
    assert sampler.mean_between(100.0, 110.0) == (None, None, None)
