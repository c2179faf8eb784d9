"""Shared infrastructure without Django: Redis keys and clients, Celery queue and task names,
node metrics, process discovery, settings from the environment and the local cluster launcher.

The console, the Celery workers, the benchmarks and the web settings import it; it imports
only the data plane (spark_runtime) and third-party libraries, never Django or the packages above
it (tests/test_layers.py checks this).
"""
