"""The output audit's child side (console/services/output_audit.py) runs without Django; its
results against plain-Python references are tested through the controller's task in
tests/bench/test_recovery_measurement.py."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_audit_imports_nothing_of_django():
    # A new interpreter: this one has Django loaded already.
    program = (
        "import sys, console.services.output_audit; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
