"""Existing Structured Streaming applications, run as they are (docs/JOBS.md, "Bring an existing
app").

An app is a plain PySpark script in the jobs directory: it builds its SparkSession, reads its
input and starts one or more queries with `writeStream`. Registration keeps a snapshot of it under
`<jobs dir>/.registered/<name>/v<N>.py` whose first line names the app's path
(`# backstop: app = apps/counts.py`); a job runs it as the topology `NAME@VERSION`, one stage
(`job`) of one operator (`app`), in a stage process (spark_runtime/app_stage.py).

    python -m spark_runtime.apps check PATH [--jobs-dir DIR]

prints a JSON report (`errors`, `path`, `name`) of the check registration runs in a child
process, without starting the app's queries: the file must compile, and every module it imports
at any level must import, each failure naming the app's line.

No Spark and no Django code here: the console and the stage process import it cheaply.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from spark_runtime.topology import MAP, OperatorSpec, Topology

APP_MARKER = "# backstop: app = "
APP_OPERATOR = "app"
# The job's `args`, the app's sys.argv[1:]: bounded, they travel on every replica's launch.
MAX_ARGS = 64
MAX_ARG_CHARS = 1024


class AppError(ValueError):
    """An app path or its arguments cannot be used; the message names what is wrong."""


@dataclass(frozen=True)
class AppDefinition:
    """A registered app: its path in the jobs directory (as its tracebacks name it) and its
    source as registered."""

    name: str
    path: str
    source: str

    def to_topology(
        self, version: int | None = None, found: tuple[OperatorSpec, ...] = ()
    ) -> Topology:
        """The app as a topology: one operator, `app`, which runs the whole script, then the
        stateful operators its running queries were `found` to have (spark_runtime/app_plan.py,
        `operator_specs`: each reads `app`). Until its measured figures exist the policy
        assumes a core and 1 GiB for `app`: it is a whole application."""
        name = self.name if version is None else f"{self.name}@{version}"
        return Topology(
            name=name,
            description=f"the streaming app {self.path}, run as it is",
            operators=(OperatorSpec(APP_OPERATOR, MAP, cpu=1.0, mem=1024.0), *found),
            job=self,
        )


def app_file(path: str, directory: Path) -> Path:
    """The file of the app at `path` (relative to the jobs directory `directory`); AppError for
    a path outside it, in its snapshots, not a `.py` file, or missing."""
    if not isinstance(path, str) or not path.strip():
        raise AppError("app: a path inside the jobs directory is required")
    base = directory.resolve()
    candidate = (base / path).resolve()
    if base not in candidate.parents:
        raise AppError(f"app {path!r}: outside the jobs directory {base}")
    if ".registered" in candidate.relative_to(base).parts:
        raise AppError(f"app {path!r}: registered snapshots cannot be registered again")
    if candidate.suffix != ".py":
        raise AppError(f"app {path!r}: expected a Python file (.py)")
    if not candidate.is_file():
        raise AppError(f"app {path!r}: no such file in {base}")
    return candidate


def relative_path(path: str, directory: Path) -> str:
    """`path` as registered: relative to the jobs directory, with forward slashes."""
    return app_file(path, directory).relative_to(directory.resolve()).as_posix()


def snapshot_text(path: str, directory: Path) -> str:
    """What a registration stores: the app's source under a first line naming its path."""
    relative = relative_path(path, directory)
    return f"{APP_MARKER}{relative}\n{app_file(path, directory).read_text()}"


def load_app_snapshot(path: Path, name: str) -> AppDefinition | None:
    """The app a snapshot file holds, or None when it holds a job module."""
    text = path.read_text()
    first, _, source = text.partition("\n")
    if not first.startswith(APP_MARKER):
        return None
    return AppDefinition(name=name, path=first[len(APP_MARKER) :].strip(), source=source)


def validate_args(args) -> list[str]:
    """The job's `args` for an app as a list of strings; AppError naming `args` otherwise."""
    if args is None:
        return []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise AppError("args: must be a list of strings")
    if len(args) > MAX_ARGS:
        raise AppError(f"args: at most {MAX_ARGS} arguments, got {len(args)}")
    long = [i for i, a in enumerate(args) if len(a) > MAX_ARG_CHARS]
    if long:
        raise AppError(f"args[{long[0]}]: at most {MAX_ARG_CHARS} characters")
    if any("\x00" in a for a in args):
        raise AppError("args: an argument may not contain a NUL character")
    return list(args)


# --- the registration check ------------------------------------------------------------------


def _guarded_by_import_error(handlers: list[ast.ExceptHandler]) -> bool:
    """Whether a `try` catches ImportError (an optional import the app handles itself)."""
    names = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
    for handler in handlers:
        kinds = handler.type
        if kinds is None:
            return True
        elements = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
        if any(isinstance(e, ast.Name) and e.id in names for e in elements):
            return True
    return False


def _imports(node: ast.AST, guarded: bool = False):
    """(statement, guarded) for every import statement under `node`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, guarded
        elif isinstance(child, ast.Try):
            inner = guarded or _guarded_by_import_error(child.handlers)
            for part in child.body:
                yield from _imports_of(part, inner)
            for part in (*child.handlers, *child.orelse, *child.finalbody):
                yield from _imports_of(part, guarded)
        else:
            yield from _imports(child, guarded)


def _imports_of(node: ast.AST, guarded: bool):
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node, guarded
    else:
        yield from _imports(node, guarded)


def _import_error(statement: ast.Import | ast.ImportFrom) -> str | None:
    """Why `statement` would fail, or None when it imports."""
    if isinstance(statement, ast.ImportFrom) and statement.level:
        return "a relative import: an app is one file (it may import installed packages only)"
    try:
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                importlib.import_module(alias.name)
            return None
        module = importlib.import_module(statement.module)
        for alias in statement.names:
            if alias.name == "*" or hasattr(module, alias.name):
                continue
            try:
                importlib.import_module(f"{statement.module}.{alias.name}")
            except ModuleNotFoundError:
                return f"ImportError: cannot import name {alias.name!r} from {statement.module!r}"
    except Exception as exc:  # noqa: BLE001 - any failure of the app's import is its report
        return f"{type(exc).__name__}: {exc}"
    return None


def check_app(path: str, directory: Path) -> dict:
    """The registration check of the app at `path`: `{"errors": [...], "path": relative}`. It
    compiles the file and imports what it imports (each at most once), without running it."""
    try:
        relative = relative_path(path, directory)
        source = app_file(path, directory).read_text()
    except (AppError, OSError, UnicodeDecodeError) as exc:
        return {"errors": [str(exc)], "path": path}
    try:
        tree = ast.parse(source, filename=relative)
        compile(tree, relative, "exec")
    except SyntaxError as exc:
        return {
            "errors": [f"{relative} line {exc.lineno}: SyntaxError: {exc.msg}"],
            "path": relative,
        }
    errors = []
    for statement, guarded in _imports(tree):
        if guarded:
            continue
        error = _import_error(statement)
        if error is not None:
            errors.append(f"{relative} line {statement.lineno}: {error}")
    if not any(isinstance(s, ast.Import | ast.ImportFrom) for s, _ in _imports(tree)):
        errors.append(f"{relative}: imports nothing; an app imports pyspark to build its queries")
    return {"errors": errors, "path": relative}


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m spark_runtime.apps check PATH`."""
    parser = argparse.ArgumentParser(prog="python -m spark_runtime.apps")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="compile the app and import its imports")
    check.add_argument("path", help="the app's path inside the jobs directory")
    check.add_argument("--jobs-dir", required=True)
    args = parser.parse_args(argv)
    report = check_app(args.path, Path(args.jobs_dir))
    print(json.dumps(report))
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
