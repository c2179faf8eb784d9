"""The data-plane fixtures (a real Redis, per-test job ids) for the Flink peer's tests."""

from tests.spark_runtime.conftest import job, redis_url  # noqa: F401
