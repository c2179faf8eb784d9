"""The data-plane benchmarks run where no Django is configured: importing one, in a fresh
interpreter, imports neither Django nor PySpark (the stage processes they start do)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MODULES = [
    "batch_cost",
    "cpu_priority",
    "failover",
    "jvm_options",
    "throughput",
    "worker_start",
]


@pytest.mark.parametrize("name", MODULES)
def test_a_dataplane_benchmark_imports_neither_django_nor_pyspark(name):
    code = (
        f"import sys, bench.dataplane.{name}; "
        "print(sorted({'django', 'pyspark'} & {m.split('.')[0] for m in sys.modules}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
