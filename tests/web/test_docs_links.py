"""The docs are self-contained: every link in a Markdown file points to a file inside the repo.

A link to a path outside the repository (`../shared/...`, `/work/...`, `file://`) or to a file
that does not exist fails, and so does a web link other than the console on the loopback address
(the README names the local console URL). A path written as text (`../x/y.md` in backticks) that
leaves the repository counts as a link too: a reader would follow it.
"""

import re
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCAL_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}

INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
AUTOLINK = re.compile(r"<([a-zA-Z][a-zA-Z0-9+.-]*:[^>\s]+)>")
BARE_URL = re.compile(r"(?<![<(])\b((?:https?|file)://[^\s)>`]+)")
TEXT_PATH = re.compile(r"(?<![\w./-])((?:\.\./|/work/|/home/|/tmp/)[\w./-]+)")


def markdown_files() -> list[Path]:
    """Tracked and new (not ignored) Markdown files of the repository."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [REPO / name for name in listed if (REPO / name).exists()]


def link_problem(md_file: Path, target: str) -> str | None:
    """Why `target`, linked from `md_file`, points outside the repo or nowhere; None if fine."""
    parsed = urlparse(target)
    if parsed.scheme in ("http", "https"):
        if parsed.hostname in LOCAL_HOSTS:
            return None
        return "links to a web page outside the repository"
    if parsed.scheme == "mailto":
        return "links to an email address"
    if parsed.scheme:
        return f"links with scheme {parsed.scheme}:"
    path_part = target.split("#", 1)[0]
    if not path_part:
        return None  # an anchor in the same file
    if path_part.startswith("/"):
        return "links to an absolute path"
    resolved = (md_file.parent / path_part).resolve()
    if not resolved.is_relative_to(REPO):
        return "links outside the repository"
    if not resolved.exists():
        return "links to a file that does not exist"
    return None


def problems(md_file: Path) -> list[str]:
    """Every bad link of one Markdown file, as 'file:line: target: why'."""
    found = []
    text = md_file.read_text(encoding="utf-8")
    # Links are blanked out (same length, so line numbers hold) once checked, so the plain-text
    # path scan below does not report them a second time.
    rest = text
    for pattern in (INLINE_LINK, REFERENCE_LINK, AUTOLINK, BARE_URL):
        for match in pattern.finditer(text):
            why = link_problem(md_file, match.group(1))
            if why:
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{md_file.relative_to(REPO)}:{line}: {match.group(1)}: {why}")
            rest = rest[: match.start()] + " " * len(match.group(0)) + rest[match.end() :]
    for match in TEXT_PATH.finditer(rest):
        target = match.group(1)
        resolved = (md_file.parent / target).resolve()
        if target.startswith("/") or not resolved.is_relative_to(REPO):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{md_file.relative_to(REPO)}:{line}: {target}: path outside the repo")
    return found


def test_the_repository_has_markdown_docs():
    names = {path.relative_to(REPO).as_posix() for path in markdown_files()}
    assert {"README.md", "docs/DESIGN.md"} <= names


@pytest.mark.parametrize(
    "md_file", markdown_files(), ids=lambda path: path.relative_to(REPO).as_posix()
)
def test_markdown_links_stay_inside_the_repository(md_file):
    assert problems(md_file) == []


@pytest.mark.parametrize(
    "text, expected",
    [
        ("See [design](../../shared/DESIGN.md).", "links outside the repository"),
        ("See [missing](docs/NOPE.md).", "links to a file that does not exist"),
        ("See [abs](/work/shared/DESIGN.md).", "links to an absolute path"),
        ("See <https://example.org/paper.pdf>.", "links to a web page outside the repository"),
        ("Read `/work/shared/DESIGN.md` section 1.", "path outside the repo"),
        ("[ref]: ../../elsewhere.md", "links outside the repository"),
    ],
)
def test_the_checker_catches_bad_links(tmp_path, text, expected):
    # The file must sit inside the repo for relative links to resolve against it.
    probe = REPO / "docs" / f"_probe_{tmp_path.name}.md"
    probe.write_text(text, encoding="utf-8")
    try:
        found = problems(probe)
    finally:
        probe.unlink()
    assert len(found) == 1 and found[0].endswith(expected), found


def test_the_checker_accepts_good_links():
    probe = REPO / "docs" / "_probe_good.md"
    probe.write_text(
        "[policy](POLICY.md#formulas), [top](#top), <http://127.0.0.1:8000/>, "
        "![shot](screenshots/job.png)",
        encoding="utf-8",
    )
    try:
        assert problems(probe) == []
    finally:
        probe.unlink()
