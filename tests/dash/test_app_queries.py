"""The job page's app card builders (console/dash/job/app_queries.py): query rows, the rates
figure and the output tail, from plain data."""

from __future__ import annotations

from console.dash.job import app_queries
from spark_runtime.progress import ProgressRecord


def record(query: str, at: float, rate: float) -> ProgressRecord:
    return ProgressRecord(
        replica="job-1", stage="job", role="primary", node="n", query=query, segment="0",
        batch=1, at=at, input_rows=5, input_rate=rate, processed_rate=rate * 3, batch_ms=80.0,
        state_rows=4, state_memory_bytes=0, rows_out=5, written=5, final=True, buffered=0,
    )  # fmt: skip


QUERY = {
    "query": "totals",
    "batch": 12,
    "input_rate": 5.25,
    "processed_rate": 40.0,
    "batch_ms": 310.4,
    "state_rows": 1200,
    "watermark": None,
    "sources": [{"source": "FileStreamSource[file:/in]", "end": '{"logOffset": 12}', "lag": 2}],
    "operators": [{"name": "totals:aggregate", "kind": "aggregate", "node": "StateStoreSave"}],
}


def test_a_query_row_has_every_figure():
    [row] = app_queries.query_rows([QUERY])
    assert row[:2] == ["totals", 12]
    assert row[6] == "—"  # no watermark
    assert row[7] == 'FileStreamSource[file:/in]: {"logOffset": 12} (lag 2)'
    assert row[8] == "totals:aggregate (aggregate)"
    [bare] = app_queries.query_rows([{**QUERY, "sources": [], "operators": []}])
    assert (bare[7], bare[8]) == ("—", "none")


def test_a_python_data_source_is_named_by_its_kafka_topics_or_its_class():
    python_source = (
        "org.apache.spark.sql.execution.datasources.v2.python."
        "PythonMicroBatchStreamWithAdmissionControl@5bd0333d"
    )
    kafka_end = '{"lines": {"0": 28, "1": 26, "2": 26}}'
    assert app_queries.source_label(python_source, kafka_end) == "Kafka lines"
    assert app_queries.source_label(python_source, '{"offset": 3}') == (
        "PythonMicroBatchStreamWithAdmissionControl"
    )
    # Cut offsets (too long to keep whole) do not parse: the class's name stands in.
    assert app_queries.source_label(python_source, '{"lines": {"0": 2') == (
        "PythonMicroBatchStreamWithAdmissionControl"
    )
    assert app_queries.source_label("KafkaV2[Subscribe[lines]]", kafka_end) == (
        "KafkaV2[Subscribe[lines]]"
    )


def test_the_rates_figure_has_an_input_and_a_processed_line_per_query():
    history = [record("totals", 100.0, 2.0), record("large", 101.0, 1.0)]
    history.append(record("totals", 102.0, 4.0))
    figure = app_queries.query_rates_figure(history)
    lines = {trace.name: list(trace.y) for trace in figure.data}
    assert lines == {
        "large input": [1.0],
        "large processed": [3.0],
        "totals input": [2.0, 4.0],
        "totals processed": [6.0, 12.0],
    }


def test_the_card_is_hidden_for_a_job_that_is_not_an_app():
    hidden, queries, figure, output = app_queries.app_panel(None)
    assert (hidden, queries, output, figure.data) == (True, None, None, ())
    view = {
        "queries": [QUERY],
        "history": [record("totals", 100.0, 2.0)],
        "output": [
            {"at": 0, "stream": "stdout", "line": "hello"},
            {"at": 1, "stream": "stderr", "line": "boom"},
        ],
    }
    hidden, _queries, figure, output = app_queries.app_panel(view)
    assert not hidden and len(figure.data) == 2
    assert output.children == "00:00:00   hello\n00:00:01 ! boom"
