"""The one writer of docs/RESULTS.md and of the benchmarks' JSON reports: every benchmark puts
its figures there through here (`write_report` for its own DIR/NAME.json).

The file is a list of `## ` sections; a section is either written whole (`write_section`, e.g.
the load test's) or holds `### ` subsections that benchmarks replace one at a time
(`write_subsection`, e.g. "Data plane" / "Throughput"). Whatever else the file holds (sections of
other benchmarks, prose written by hand between them) is left as it is. No Django imports: the
data-plane benchmarks use it too.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import sys
from pathlib import Path

log = logging.getLogger(__name__)

RESULTS_MD = Path(__file__).resolve().parent.parent / "docs" / "RESULTS.md"


def command_line(name: str, options: dict, shown: tuple[str, ...]) -> str:
    """`manage.py NAME ...` as run, for a report and RESULTS.md: the command line when this
    process is that command, else (called from code, e.g. a test) the options of `shown` that
    have a value, a flag bare."""
    if sys.argv[1:2] == [name]:
        return f"manage.py {name} " + shlex.join(sys.argv[2:])
    given = []
    for option in shown:
        value, flag = options.get(option), "--" + option.replace("_", "-")
        if value is True:
            given.append(flag)
        elif value:
            given += [flag, str(value)]
    return f"manage.py {name} " + shlex.join(given)


def write_report(out_dir: Path | str, name: str, data) -> Path:
    """Write a benchmark's JSON report `out_dir/name` (the directory made if missing), whole or
    not at all: a reader, or a run killed half-way, never sees half a file. Values JSON does
    not know (datetimes, paths) are written as their str()."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    partial.replace(path)
    return path


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.exists() else "# Results\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip() + "\n", encoding="utf-8")


def _section_span(text: str, section: str) -> tuple[int, int] | None:
    """Where the `## ` section `section` (its heading line, as written) starts and ends."""
    match = re.search(rf"^{re.escape(section)}[ \t]*$", text, flags=re.M)
    if match is None:
        return None
    following = re.search(r"^## ", text[match.end() :], flags=re.M)
    return match.start(), match.end() + following.start() if following else len(text)


def write_section(section: str, body: str, path: Path | str = RESULTS_MD) -> None:
    """Replace the whole `## ` section `section` (the heading line, e.g. "## Load (manage.py
    loadtest)") with the heading and `body`, or append it at the end of the file."""
    path = Path(path)
    text = _read(path)
    block = f"{section}\n\n{body.strip()}\n"
    span = _section_span(text, section)
    if span is None:
        text = text.rstrip() + "\n\n" + block
    else:
        start, end = span
        text = text[:start] + block + ("\n" + text[end:] if end < len(text) else "")
    _write(path, text)
    log.info("wrote %s to %s", section, path)


def write_subsection(
    section: str, subsection: str, body: str, path: Path | str = RESULTS_MD
) -> None:
    """Replace `### {subsection}` inside the `## ` section `section` with `body`, or add it at
    the end of that section (the section itself at the end of the file if it is missing)."""
    path = Path(path)
    text = _read(path)
    block = f"### {subsection}\n\n{body.strip()}\n"
    span = _section_span(text, section)
    if span is None:
        text = text.rstrip() + f"\n\n{section}\n\n{block}"
    else:
        start, end = span
        part = text[start:end]
        pattern = re.compile(rf"^### {re.escape(subsection)}\n.*?(?=^### |\Z)", flags=re.M | re.S)
        if pattern.search(part):
            part = pattern.sub(lambda _m: block + "\n", part)
        else:
            part = part.rstrip() + "\n\n" + block + "\n"
        text = text[:start] + part.rstrip() + "\n\n" + text[end:].lstrip()
    _write(path, text)
    log.info("wrote %s / %s to %s", section, subsection, path)
