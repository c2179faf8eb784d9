"""The native-memory benchmark's reading of `jcmd PID VM.native_memory summary scale=KB` and its
table (pure: no JVM is started)."""

import pytest

from bench.dataplane.native_memory import (
    HEAP_RESIDENT,
    committed_mb,
    heap_range,
    parse_args,
    resident_mb_in,
    rows,
)

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


# `jcmd PID GC.heap_info` of a stage JVM (serial collector) during the density run of 2026-11-30.
HEAP_INFO = """\
25505:
 def new generation   total 116224K, used 61665K [0x00000000c0000000, 0x00000000c7e10000, 0x00000000d5550000)
  eden space 103360K,  59% used [0x00000000c0000000, 0x00000000c3c38560, 0x00000000c64f0000)
  from space 12864K,   0% used [0x00000000c64f0000, 0x00000000c64f0000, 0x00000000c7180000)
  to   space 12864K,   0% used [0x00000000c7180000, 0x00000000c7180000, 0x00000000c7e10000)
 tenured generation   total 258048K, used 45620K [0x00000000d5550000, 0x00000000e5150000, 0x0000000100000000)
   the space 258048K,  17% used [0x00000000d5550000, 0x00000000d81dd0a8, 0x00000000d81dd200, 0x00000000e5150000)
 Metaspace       used 110932K, committed 111552K, reserved 1179648K
"""  # noqa: E501

SMAPS = """\
55d0a000-55d0b000 r--p 00000000 fe:01 1234 /usr/lib/jvm/java-17-openjdk-amd64/bin/java
Rss:                   4 kB
c0000000-c7e10000 rw-p 00000000 00:00 0
Size:             129088 kB
Rss:              102400 kB
c7e10000-d5550000 ---p 00000000 00:00 0
Rss:                   0 kB
d5550000-e5150000 rw-p 00000000 00:00 0
Rss:               65536 kB
100000000-100200000 rw-p 00000000 00:00 0
Rss:                2048 kB
"""


def test_the_heap_is_the_range_of_its_generations_and_its_resident_size_their_rss():
    start, end = heap_range(HEAP_INFO)
    assert (start, end) == (0xC0000000, 0x100000000)
    # Young (100 MB) and tenured (64 MB) resident; the java binary and the class space beyond
    # the heap's end are not the heap.
    assert resident_mb_in(SMAPS, start, end) == 164.0
    with pytest.raises(RuntimeError, match="no heap address range"):
        heap_range("25505:\n Metaspace used 1K\n")


def test_the_table_shows_the_heap_resident_beside_rss_when_sampled():
    at_10 = {"total": 640.0, HEAP_RESIDENT: 300.0}
    at_20 = {"total": 640.0, HEAP_RESIDENT: 340.0}
    table = rows({"label": "v", "samples": [(10.0, 600.0, at_10), (20.0, 650.0, at_20)]}, 10)
    assert "| v | Java Heap resident (smaps) | 300.0 | 340.0 | +40.0 |" in table
    assert "| v | RSS less heap resident | 300.0 | 310.0 | +10.0 |" in table
    assert "| v | the other categories | 0.0 | 0.0 | +0.0 |" in table
