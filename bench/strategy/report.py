"""bench.json -> bench.md (tables) and bench.png (throughput and latency over time)."""

from __future__ import annotations

from statistics import mean

BASELINE = "restart-all"
PEER = "flink"  # the run of bench/flink_peer/peer.py, when the benchmark ran one


def mean_recovery(run: dict) -> float | None:
    """Mean recovery time of a run's faults; None when a fault never recovered (or no faults)."""
    times = [f["recovery_time_s"] for f in run["faults"]]
    if not times or any(t is None for t in times):
        return None
    return round(mean(times), 2)


def recovery_bound(run: dict) -> tuple[float | None, bool]:
    """(mean recovery time, whether it is only a lower bound): a fault that was not back to
    normal when the next one came (or the input ended) counts with the time it was watched."""
    faults = run["faults"]
    if not faults:
        return None, False
    times = [f["recovery_time_s"] if f["recovery_time_s"] is not None else f.get("watched_s")
             for f in faults]  # fmt: skip
    if any(t is None for t in times):
        return None, False
    return round(mean(times), 2), any(f["recovery_time_s"] is None for f in faults)


def ratio_text(run: dict, baseline: dict | None) -> str:
    """This run's mean recovery relative to the baseline's, with < or > when a side is a bound."""
    own, own_bound = recovery_bound(run)
    base, base_bound = recovery_bound(baseline) if baseline else (None, False)
    if own is None or not base or (own_bound and base_bound):
        return "n/a"
    text = f"{own / base * 100:.0f}%"
    if base_bound and not own_bound:
        return f"< {text}"
    if own_bound and not base_bound:
        return f"> {text}"
    return text


def mean_downtime(run: dict) -> float | None:
    times = [f["downtime_s"] for f in run["faults"]]
    if not times or any(t is None for t in times):
        return None
    return round(mean(times), 2)


def _fmt(value, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}{suffix}"
    return f"{value}{suffix}"


def _recovery_cell(fault: dict) -> str:
    if fault["recovery_time_s"] is None and fault.get("watched_s") is not None:
        return f"> {fault['watched_s']:.1f}"
    return _fmt(fault["recovery_time_s"], 2)


def _lost(run: dict) -> str:
    """Lost results; for a run whose output had not caught up when the wait ended, say so."""
    if run.get("drained", True):
        return str(run["lost"])
    return f"{run['lost']} (not caught up after {run.get('drain_s', '?')} s)"


def policy_text(changes) -> str:
    """The run's policy settings beyond the version in force (`--policy`), for the header."""
    if not changes:
        return ""
    return ", policy " + ", ".join(f"{name}={value}" for name, value in changes)


def source_text(settings: dict) -> str:
    """The runs' source and trigger beyond the defaults (Redis, micro-batch), for a heading."""
    source, trigger = settings.get("source", "redis"), settings.get("trigger", "microbatch")
    if source == "redis" and trigger == "microbatch":
        return ""
    return f", source {source}, trigger {trigger}"


def _audited(run: dict) -> str:
    """Where a run's lost and duplicated results were counted."""
    kafka = run.get("kafka")
    if kafka is None:
        return "Redis results" if run.get("strategy") != PEER else "the peer's Redis results"
    redis = kafka.get("redis_results") or {}
    return (
        f"output topic `{kafka['output_topic']}` ({kafka['output_records']} records, "
        f"{kafka['repeated']} read twice; Redis results: lost {redis.get('lost', 'n/a')}, dup "
        f"{redis.get('duplicates', 'n/a')})"
    )


def source_lines(runs: list[dict]) -> list[str]:
    """Each run's source and trigger, its input, and where its results were audited (older
    bench.json files have no source: Redis, micro-batch)."""
    lines = [
        "| strategy | source | trigger | input events | lost and dup counted on |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        source = run.get("source", "redis")
        if run.get("kafka"):
            source += f" (`{run['kafka']['input_topic']}`)"
        trigger = run.get("trigger", "microbatch")  # None: the peer, no Spark trigger
        lines.append(
            f"| {run['strategy']} | {source} | {trigger or 'n/a'} | "
            f"{_fmt(run.get('input_events'))} | {_audited(run)} |"
        )
    return lines


def to_markdown(bench: dict) -> str:
    """The summary table (one row per strategy) and the per-fault table."""
    runs = bench["runs"]
    baseline = next((r for r in runs if r["strategy"] == BASELINE), None)
    settings = bench.get("settings", {})
    lines = [
        f"Topology `{settings.get('topology', '?')}`, fault `{settings.get('fault_kind', '?')}` "
        f"x{settings.get('faults', '?')} on `{settings.get('target', '?')}`, "
        f"{settings.get('rate', '?')} events/s, warm-up {settings.get('warmup_s', '?')} s, "
        f"measured {settings.get('duration_s', '?')} s, recovery band "
        f"{settings.get('band', '?')}, stable window {settings.get('stable_window_s', '?')} s"
        + source_text(settings)
        + policy_text(settings.get("policy") or ())
        + ".",
        "",
        "| strategy | mean downtime s | mean recovery s | vs restart-all | worst peak p99 ms "
        "| lost | dup | steady p50 ms | steady p99 ms | events/s | CPU % | RSS MB | PSS MB "
        "| spares CPU % | spares RSS MB | spares PSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        steady = run["steady"]
        peaks = [f["peak_p99_ms"] for f in run["faults"] if f["peak_p99_ms"] is not None]
        recovery, is_bound = recovery_bound(run)
        lines.append(
            f"| {run['strategy']} | {_fmt(mean_downtime(run), 2)} | "
            f"{'> ' if is_bound else ''}{_fmt(recovery, 2)} | {ratio_text(run, baseline)} | "
            f"{_fmt(max(peaks) if peaks else None, 0)} | {_lost(run)} | {run['duplicates']} | "
            f"{_fmt(steady['p50_ms'], 0)} | {_fmt(steady['p99_ms'], 0)} | "
            f"{_fmt(steady['throughput_eps'], 1)} | {_fmt(steady['cpu_pct'], 0)} | "
            f"{_fmt(steady['rss_mb'], 0)} | {_fmt(steady.get('pss_mb'), 0)} | "
            f"{_fmt(steady.get('spares_cpu_pct'), 0)} | {_fmt(steady.get('spares_rss_mb'), 0)} | "
            f"{_fmt(steady.get('spares_pss_mb'), 0)} |"
        )
    lines += memory_lines(runs, baseline)
    lines += ["", *source_lines(runs)]
    lines += [
        "",
        "| strategy | fault | at s | action | detected after s | downtime s | recovery s "
        "| peak p99 ms | re-protect s | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        for number, fault in enumerate(run["faults"], start=1):
            lines.append(
                f"| {run['strategy']} | {number}: {fault['kind']} | {_fmt(fault['at_s'])} | "
                f"{fault.get('action') or 'n/a'} | {_fmt(fault.get('detected_after_s'), 2)} | "
                f"{_fmt(fault['downtime_s'], 2)} | "
                f"{_recovery_cell(fault)} | {_fmt(fault['peak_p99_ms'], 0)} | "
                f"{_fmt(fault.get('reprotect_s'), 1)} | {fault.get('note', '')} |"
            )
    lines += broker_lines(runs)
    peer = next((r for r in runs if r["strategy"] == PEER), None)
    if peer is not None:
        lines += ["", *peer_lines(runs, peer)]
    return "\n".join(lines) + "\n"


def broker_lines(runs: list[dict]) -> list[str]:
    """The kafka-broker faults' own figures: how long the broker was away (its stop until it
    answered an AdminClient again) and the job's first output after its return."""
    rows = [
        (run["strategy"], number, fault["broker"])
        for run in runs
        for number, fault in enumerate(run["faults"], start=1)
        if fault.get("broker")
    ]
    if not rows:
        return []
    lines = [
        "",
        "| strategy | fault | broker away s | first output after its return s |",
        "|---|---|---|---|",
    ]
    for strategy, number, broker in rows:
        lines.append(
            f"| {strategy} | {number} | {_fmt(broker['down_s'], 1)} | "
            f"{_fmt(broker['output_after_return_s'], 2)} |"
        )
    return lines


def peer_lines(runs: list[dict], peer: dict) -> list[str]:
    """Backstop's strategies against the Flink run of the same workload and faults."""
    info = peer.get("peer", {})
    lines = [
        f"Backstop vs Flink {info.get('flink_version', '?')}: Flink standalone, "
        f"{info.get('taskmanagers', '?')} one-slot TaskManagers (parallelism "
        f"{info.get('parallelism', '?')}, one spare), exactly-once checkpoints every "
        f"{_fmt(info.get('checkpoint_ms'), 0)} ms, Python bundles of at most "
        f"{_fmt(info.get('bundle_time_ms'), 0)} ms, buffer timeout "
        f"{_fmt(info.get('buffer_timeout_ms'), 0)} ms, "
        + "".join(f"{key} {value}, " for key, value in info.get("extra_conf", {}).items())
        + f"{len(info.get('failures', []))} failure(s) in its exception history; "
        + peer_io_text(info),
        "",
        # Flink's memory counts its spare TaskManager, so Backstop's counts its idle warm spares.
        "| run | mean recovery s | vs Flink | steady p50 ms | p50 vs Flink | lost | dup "
        "| RSS MB with spares | PSS MB with spares |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    flink_p50 = peer["steady"]["p50_ms"]
    for run in runs:
        recovery, is_bound = recovery_bound(run)
        p50 = run["steady"]["p50_ms"]
        p50_ratio = f"{p50 / flink_p50:.2f}x" if p50 and flink_p50 else "n/a"
        lines.append(
            f"| {run['strategy']} | {'> ' if is_bound else ''}{_fmt(recovery, 2)} | "
            f"{ratio_text(run, peer) if run is not peer else '100%'} | {_fmt(p50, 0)} | "
            f"{p50_ratio} | {_lost(run)} | {run['duplicates']} | "
            f"{_fmt(with_spares(run['steady'], 'rss_mb'), 0)} | "
            f"{_fmt(with_spares(run['steady'], 'pss_mb'), 0)} |"
        )
    return lines + phase_lines(peer)


def peer_io_text(info: dict) -> str:
    """How the peer's input and output went (bench/flink_peer/peer.py, `peer_record`)."""
    if info.get("source") == "kafka":
        return (
            "it reads its input topic with Flink's KafkaSource and writes its output topic with "
            f"Flink's KafkaSink ({info.get('kafka_connector')}, exactly once: its results are "
            "read when the checkpoint that commits them completes)."
        )
    return (
        f"its input crosses the file bridge (p50 {_fmt(info.get('bridge_p50_ms'), 0)} ms, p99 "
        f"{_fmt(info.get('bridge_p99_ms'), 0)} ms of its latency)."
    )


PHASES = ("detection_s", "restart_delay_s", "deployment_s", "initialization_s", "first_output_s")


def phase_lines(peer: dict) -> list[str]:
    """Where the Flink run's gap went after each fault (bench/flink_peer/phases.py)."""
    faults = [f for f in peer["faults"] if f.get("phases")]
    if not faults:
        return []
    lines = [
        "",
        "Where Flink's gap went, from its JobManager's log (detection: the fault to the job "
        "RESTARTING; restart delay: to RUNNING again; deployment: to the last task deployed; "
        "initialization: to the last task running, its state restored and its Python worker "
        "up; first output: to the next output, the replay's start):",
        "",
        "| fault | at s | detection s | restart delay s | deployment s | initialization s "
        "| first output s |",
        "|---|---|---|---|---|---|---|",
    ]
    for number, fault in enumerate(peer["faults"], start=1):
        steps = fault.get("phases") or {}
        lines.append(
            f"| {number}: {fault['kind']} | {_fmt(fault['at_s'])} | "
            + " | ".join(_fmt(steps.get(name), 2) for name in PHASES)
            + " |"
        )
    return lines


def memory_lines(runs: list[dict], baseline: dict | None) -> list[str]:
    """Each Backstop strategy's memory with its idle warm spares as a multiple of restart-all's
    (which keeps none), RSS and PSS; nothing without a baseline or for runs not sampled."""
    if baseline is None:
        return []
    base_rss, base_pss = baseline["steady"].get("rss_mb"), baseline["steady"].get("pss_mb")
    parts = []
    for run in runs:
        if run is baseline or run["strategy"] == PEER:
            continue
        rss, pss = with_spares(run["steady"], "rss_mb"), with_spares(run["steady"], "pss_mb")
        figures = [
            f"{name} {mine / base:.2f}x"
            for name, mine, base in (("RSS", rss, base_rss), ("PSS", pss, base_pss))
            if mine is not None and base
        ]
        if figures:
            parts.append(f"{run['strategy']} {', '.join(figures)}")
    if not parts:
        return []
    return ["", f"Memory with idle warm spares, against {BASELINE}'s: {'; '.join(parts)}."]


def with_spares(steady: dict, figure: str) -> float | None:
    """A run's steady memory `figure` ("rss_mb" or "pss_mb") with its idle warm spares' (none
    sampled: the job's alone); None when the job's was not sampled (older bench.json: no PSS)."""
    if steady.get(figure) is None:
        return None
    return steady[figure] + (steady.get(f"spares_{figure}") or 0.0)


def plot_png(bench: dict, path) -> None:
    """Throughput and p99 latency per second for every strategy, faults marked."""
    # matplotlib only when a plot is drawn: a heavy import that the tables do not need.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = bench["runs"]
    figure = Figure(figsize=(11, 2.4 * max(len(runs), 1) + 0.6), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(max(len(runs), 1), 1, sharex=True, squeeze=False)[:, 0]
    for axis, run in zip(axes, runs, strict=False):
        series = run.get("series") or {"t": [], "throughput": [], "p99_ms": []}
        axis.plot(series["t"], series["throughput"], color="#1f77b4", linewidth=0.9)
        axis.set_ylabel("rows/s into the\nfinal stage", color="#1f77b4")
        axis.set_title(
            f"{run['strategy']}: mean recovery {_fmt(mean_recovery(run), 1, ' s')}, "
            f"lost {run['lost']}, dup {run['duplicates']}",
            fontsize=9,
            loc="left",
        )
        latency = axis.twinx()
        latency.plot(
            series["t"], [v / 1000.0 for v in series["p99_ms"]], color="#d62728", linewidth=0.9
        )
        latency.set_ylabel("p99 s", color="#d62728")
        for fault in run["faults"]:
            axis.axvline(fault["at_s"], color="black", linestyle="--", linewidth=0.8)
            if fault.get("recovery_time_s") is not None:
                axis.axvspan(
                    fault["at_s"], fault["at_s"] + fault["recovery_time_s"], color="orange",
                    alpha=0.2,
                )  # fmt: skip
    axes[-1].set_xlabel("seconds since the input started (dashed: fault; shaded: recovery)")
    figure.tight_layout()
    figure.savefig(path)
