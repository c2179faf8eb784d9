"""docs/RESULTS.md's one writer (bench/results.py): a benchmark's part is replaced, never
appended twice, and the rest of the file is left as it was."""

from bench.results import write_section, write_subsection

STRATEGY = "## Strategy benchmark (manage.py bench)"


def test_results_subsection_is_replaced_not_appended_twice(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Results\n\n## Data plane\n\n### Throughput\n\nkept\n")
    write_subsection(STRATEGY, "wordcount, kill-driver, 4 fault(s)", "first", path)
    write_subsection(STRATEGY, "wordcount, kill-driver, 4 fault(s)", "second", path)
    text = path.read_text()
    assert "kept" in text and "second" in text and "first" not in text
    assert text.count(STRATEGY) == 1


def test_a_new_subsection_goes_at_the_end_of_its_section(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Results\n\n## Data plane\n\n### Throughput\n\nt\n\n## Load\n\nl\n")
    write_subsection("## Data plane", "Batch cost", "b", path)
    assert path.read_text() == (
        "# Results\n\n## Data plane\n\n### Throughput\n\nt\n\n### Batch cost\n\nb\n\n## Load\n\nl\n"
    )


def test_a_whole_section_is_replaced_and_the_others_kept(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Results\n\n## Data plane\n\nkeep\n\n## Load\n\nold\n\n## Later\n\ntoo\n")
    write_section("## Load", "new", path)
    assert path.read_text() == (
        "# Results\n\n## Data plane\n\nkeep\n\n## Load\n\nnew\n\n## Later\n\ntoo\n"
    )
    write_section("## Appendix", "a", path)
    assert path.read_text().endswith("## Later\n\ntoo\n\n## Appendix\n\na\n")


def test_a_missing_file_is_started(tmp_path):
    path = tmp_path / "docs" / "RESULTS.md"
    write_subsection("## Data plane", "Throughput", "t", path)
    assert path.read_text() == "# Results\n\n## Data plane\n\n### Throughput\n\nt\n"
