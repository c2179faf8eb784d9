"""The native-memory benchmark's reading of `jcmd PID VM.native_memory summary scale=KB` and its
table (pure: no JVM is started)."""

import pytest

from bench.dataplane.native_memory import committed_mb, parse_args, rows

# The head of a JDK 17 summary at scale=KB, as jcmd prints it (figures of a stage JVM).
SUMMARY = """\
12345:

Native Memory Tracking:

(Omitting categories weighting less than 1KB)

Total: reserved=2097152KB, committed=655360KB
       malloc: 40960KB #123456
       mmap:   reserved=2056192KB, committed=614400KB

-                 Java Heap (reserved=1048576KB, committed=409600KB)
                            (mmap: reserved=1048576KB, committed=409600KB)

-                     Class (reserved=1050624KB, committed=51200KB)
                            (classes #12000)

-                    Thread (reserved=61440KB, committed=6144KB)
                            (thread #60)

-                      Code (reserved=253952KB, committed=30720KB)

-                        GC (reserved=51200KB, committed=51200KB)

-                     Other (reserved=2048KB, committed=2048KB)

-                    Symbol (reserved=20480KB, committed=20480KB)
"""


def test_the_summary_gives_committed_mb_per_category_and_the_total():
    found = committed_mb(SUMMARY)
    assert found["total"] == 640.0
    assert found["Java Heap"] == 400.0
    assert (found["Class"], found["Thread"], found["Code"]) == (50.0, 6.0, 30.0)
    assert (found["GC"], found["Other"], found["Symbol"]) == (50.0, 2.0, 20.0)


def test_text_that_is_no_summary_is_refused():
    with pytest.raises(RuntimeError, match="not a native memory summary"):
        committed_mb("12345:\nNative memory tracking is not enabled\n")


def test_rows_show_the_growth_from_the_minute_asked_including_outside_the_jvm():
    at_10 = {"total": 640.0, "Java Heap": 400.0, "Symbol": 20.0}
    at_20 = {"total": 650.0, "Java Heap": 400.0, "Symbol": 30.0}
    run = {
        "label": "v",
        "samples": [(5.0, 500.0, at_10), (10.2, 560.0, at_10), (19.8, 620.0, at_20)],
    }
    table = rows(run, since=10)
    assert "| v | RSS | 560.0 | 620.0 | +60.0 |" in table
    assert "| v | JVM committed (NMT total) | 640.0 | 650.0 | +10.0 |" in table
    assert "| v | Java Heap | 400.0 | 400.0 | +0.0 |" in table
    assert "| v | the other categories | 20.0 | 30.0 | +10.0 |" in table
    # What RSS gained beyond what the JVM committed: native libraries' mallocs.
    assert "| v | RSS less JVM committed | -80.0 | -30.0 | +50.0 |" in table


def test_the_growth_is_measured_from_a_minute_before_the_end():
    assert parse_args([]).minutes == 20.0 and parse_args([]).since == 10.0
