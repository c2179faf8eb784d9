"""A StreamingQueryListener whose progress events cross from the JVM to Python as one JSON string.

PySpark's own listener bridge builds each progress event in Python from the JVM object, getter by
getter, and turns every Java map in it (`durationMs`, `eventTime`, each source's, sink's and
state operator's metrics) into a dict by iterating it through Py4J. Py4J ends such an iteration
with a Java NoSuchElementException, and PySpark's error converter then asks the JVM, through
`jvm.py4j.reflection.TypeUtil`, whether that exception is one of eight known kinds: each lookup
of `py4j` by name makes the JVM try it as a class in every package PySpark imported, and a class
that is not there is searched for in every jar of Spark's class path. In a steady wordcount stage
at 50 events/s (0.5 s trigger) that was half of the JVM's CPU samples and about a fifth of the
stage's CPU (docs/RESULTS.md, "Batch cost: where it goes"). Here a progress event costs two Py4J
calls (`progress()`, `json()`) and one `json.loads`; the event Python sees is the same class,
built by `StreamingQueryProgress.fromJson`, the path Spark Connect's listeners take.

No Django imports: stage processes import this module.
"""

from __future__ import annotations

import json
import math

from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import (
    JStreamingQueryListener,
    QueryProgressEvent,
    StreamingQueryProgress,
)

# A source's rates that Spark leaves out of the JSON when they are not finite (NaN after two
# triggers in the same millisecond) and PySpark's SourceProgress.fromJson requires.
SOURCE_RATES = ("inputRowsPerSecond", "processedRowsPerSecond")


def progress_event(jevent) -> QueryProgressEvent:
    """The Python QueryProgressEvent of a JVM one, read from its progress's JSON (a rate left
    out reads as NaN, as PySpark's own bridge gives it)."""
    progress = json.loads(jevent.progress().json())
    for source in progress.get("sources", []):
        for rate in SOURCE_RATES:
            source.setdefault(rate, math.nan)
    return QueryProgressEvent(StreamingQueryProgress.fromJson(progress))


class _JsonProgressBridge(JStreamingQueryListener):
    """PySpark's bridge (the Java listener interface Py4J calls back), with progress events
    read from JSON. Started, idle and terminated events keep PySpark's conversion: they hold no
    maps, so it makes no failing calls."""

    def onQueryProgress(self, jevent) -> None:
        self.pylistener.onQueryProgress(progress_event(jevent))


class JsonProgressListener(StreamingQueryListener):
    """Subclass this instead of StreamingQueryListener; register it with
    `spark.streams.addListener` as usual."""

    @property
    def _jlistener(self):
        # StreamingQueryManager.addListener registers this JVM object (PySpark's own property
        # builds the same wrapper around its default bridge).
        from pyspark import SparkContext

        if not hasattr(self, "_jlistenerobj"):
            self._jlistenerobj = SparkContext._jvm.PythonStreamingQueryListenerWrapper(
                _JsonProgressBridge(self)
            )
        return self._jlistenerobj
