"""tests/slow_slices.txt, the rotation of the slow tests that .ci/run runs one slice of per day:
every slow test is in exactly one slice, every entry names a slow test that exists, and each
slice's minutes fit the budget. A slow test left out of it would never run anywhere."""

from __future__ import annotations

import ast
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLICES = ROOT / "tests" / "slow_slices.txt"
# What one slice may add to a CI run beside the default suite (CI allows 90 minutes in all).
SLICE_BUDGET_MIN = 25


def is_slow_mark(node: ast.expr) -> bool:
    """`pytest.mark.slow`, as a decorator or in a module's `pytestmark`."""
    return isinstance(node, ast.Attribute) and node.attr == "slow" and "mark" in ast.unparse(node)


def slow_tests_of(path: Path) -> set[str]:
    """The node ids (`path::name`) of the slow test functions of one module."""
    tree = ast.parse(path.read_text())
    module_slow = False
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "pytestmark"
            for target in statement.targets
        ):
            value = statement.value
            marks = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
            module_slow = any(is_slow_mark(mark) for mark in marks)
    relative = path.relative_to(ROOT).as_posix()
    return {
        f"{relative}::{statement.name}"
        for statement in tree.body
        if isinstance(statement, ast.FunctionDef)
        and statement.name.startswith("test")
        and (module_slow or any(is_slow_mark(mark) for mark in statement.decorator_list))
    }


def all_slow_tests() -> set[str]:
    found = set()
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if "mark.slow" in path.read_text():
            found |= slow_tests_of(path)
    return found


def entries() -> list[tuple[int, float, str]]:
    """(slice, minutes, entry) per line; an entry is a module path or a test's node id."""
    rows = []
    for number, line in enumerate(SLICES.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split()
        assert len(fields) == 3, f"line {number}: `SLICE MINUTES ENTRY`, got {line!r}"
        rows.append((int(fields[0]), float(fields[1]), fields[2]))
    return rows


def covered(entry: str, slow: set[str]) -> set[str]:
    """The slow tests an entry runs under `-m slow`."""
    if "::" in entry:
        return {entry} & slow
    return {test for test in slow if test.split("::")[0] == entry}


def test_every_slow_test_is_in_exactly_one_slice():
    slow = all_slow_tests()
    assert len(slow) > 20  # the parser found the slow tests at all
    runs = Counter()
    for _, _, entry in entries():
        tests = covered(entry, slow)
        assert tests, f"{entry}: names no slow test (moved, renamed, or no longer slow?)"
        runs.update(tests)
    assert sorted(slow - set(runs)) == [], "slow tests in no slice: never run by CI"
    assert [test for test, n in runs.items() if n > 1] == [], "slow tests in two slices"


def test_slices_are_numbered_from_one_and_fit_the_budget():
    minutes = defaultdict(float)
    for number, estimate, _ in entries():
        minutes[number] += estimate
    assert sorted(minutes) == list(range(1, len(minutes) + 1))
    over = {number: total for number, total in minutes.items() if total > SLICE_BUDGET_MIN}
    assert over == {}, f"slices over {SLICE_BUDGET_MIN} minutes"


def test_the_parser_tells_slow_tests_from_the_others(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    module = tmp_path / "tests" / "test_example.py"
    module.parent.mkdir()
    module.write_text(
        "import pytest\n\n"
        "@pytest.mark.slow\ndef test_long():\n    pass\n\n"
        "@pytest.mark.spark\ndef test_short():\n    pass\n"
    )
    assert slow_tests_of(module) == {"tests/test_example.py::test_long"}
    module.write_text(
        "import pytest\n\npytestmark = [pytest.mark.spark, pytest.mark.slow]\n\n"
        "def test_a():\n    pass\n\ndef helper():\n    pass\n"
    )
    assert slow_tests_of(module) == {"tests/test_example.py::test_a"}
