"""The human side of an analysis: ``report.md`` with matplotlib plots, and a rich summary.

Everything here works on small pandas tables that Spark already aggregated
(summary, rollups, hot keys, log-binned histograms), never on the facts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .tables import BINS_PER_DECADE

if TYPE_CHECKING:
    import pandas as pd

    from .tables import AnalysisResult, Quality

__all__ = ["markdown_table", "print_summary", "write_report"]

#: Sweeps with more scenarios than this get plots of the first ones only.
MAX_PANELS = 6


def _fmt(value: Any, kind: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if kind == "ms":
        return f"{float(value) * 1e3:.3f}"
    if kind == "pct":
        return f"{float(value) * 100:.2f}%"
    if kind == "int":
        return f"{int(value):,}"
    return str(value)


def markdown_table(frame: pd.DataFrame, columns: Sequence[tuple[str, str, str]]) -> str:
    """A Markdown table of ``frame``: ``columns`` are (column, header, format) with
    format ``ms`` (seconds shown as milliseconds), ``pct``, ``int`` or ``str``."""
    lines = [
        "| " + " | ".join(header for _, header, _ in columns) + " |",
        "|" + "|".join("---" if kind == "str" else "---:" for _, _, kind in columns) + "|",
    ]
    for row in frame.to_dict("records"):
        cells = [_fmt(row[name], kind).replace("|", "\\|") for name, _, kind in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


_SUMMARY_COLUMNS = [
    ("scenario", "scenario", "str"),
    ("purgatory", "purgatory", "str"),
    ("ops", "ops", "int"),
    ("completed", "completed", "int"),
    ("expired", "expired", "int"),
    ("cancelled", "cancelled", "int"),
    ("failed", "failed", "int"),
    ("errors", "error answers", "int"),
    ("expiry_rate", "expiry rate", "pct"),
    ("error_rate", "error rate", "pct"),
    ("wait_p50", "wait p50 ms", "ms"),
    ("wait_p99", "wait p99 ms", "ms"),
    ("wait_max", "wait max ms", "ms"),
    ("lateness_p99", "lateness p99 ms", "ms"),
    ("lateness_max", "lateness max ms", "ms"),
]


def _plot_histograms(
    histograms: pd.DataFrame, metric: str, path: Path, xlabel: str, by_outcome: bool
) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = histograms[histograms["metric"] == metric]
    if data.empty:
        return False
    scenarios = sorted(data["scenario"].unique())[:MAX_PANELS]
    fig, axes = plt.subplots(
        len(scenarios), 1, figsize=(8, 2.6 * len(scenarios) + 0.6), squeeze=False
    )
    for ax, scenario in zip(axes[:, 0], scenarios, strict=True):
        part = data[data["scenario"] == scenario]
        answer = _answer_labels(part)
        groups = sorted(answer.unique()) if by_outcome else [None]
        for group in groups:
            rows = part if group is None else part[answer == group]
            zero = int(rows[rows["bin"].isna()]["count"].sum())
            binned = rows[rows["bin"].notna()].groupby("bin")["count"].sum().sort_index()
            label = group or metric
            if zero:
                label += f" ({zero:,} at 0)"
            if binned.empty:
                ax.plot([], [], label=label)
                continue
            first, last = int(binned.index.min()), int(binned.index.max())
            counts = binned.reindex(range(first, last + 1), fill_value=0)
            edges = [10 ** (b / BINS_PER_DECADE) for b in range(first, last + 2)]
            ax.stairs(counts.to_numpy(), edges, label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(str(scenario), fontsize=9)
        ax.set_ylabel("ops")
        # A fixed corner: "best" (the default) searches every position against
        # the data, and warns when that took more than a second of wall time (a
        # warning the tests make an error, which a loaded machine triggered).
        ax.legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel(xlabel)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _answer_labels(frame: pd.DataFrame) -> pd.Series:
    """``outcome``, or ``outcome: error`` for rows with an error answer."""
    outcome = frame["outcome"].astype(str)
    if "error" not in frame:
        return outcome
    errors = frame["error"]
    return outcome.where(errors.isna(), outcome + ": " + errors.astype(str))


def _plot_expiries(rollups: pd.DataFrame, path: Path, interval: float) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if rollups.empty:
        return False
    columns = ["expired", "errors", "ops"]
    per = rollups.groupby(["scenario", "interval_start"])[columns].sum().reset_index()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    for scenario in sorted(per["scenario"].unique())[:MAX_PANELS]:
        part = per[per["scenario"] == scenario].sort_values("interval_start")
        (line,) = top.plot(part["interval_start"], part["expired"], label=f"{scenario} expired")
        bottom.plot(part["interval_start"], part["expired"] / part["ops"], color=line.get_color())
        if part["errors"].any():
            # Ops answered with an error (whatever their outcome): dashed, same colour.
            top.plot(
                part["interval_start"],
                part["errors"],
                linestyle="--",
                color=line.get_color(),
                label=f"{scenario} error answers",
            )
            bottom.plot(
                part["interval_start"],
                part["errors"] / part["ops"],
                linestyle="--",
                color=line.get_color(),
            )
    top.set_ylabel(f"ops per {interval:g} s")
    bottom.set_ylabel("share of ops")
    bottom.set_xlabel("finished_at (loop time, s)")
    top.legend(fontsize=8, loc="upper left")  # a fixed corner, as in _plot_histograms
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_report(
    out: Path,
    *,
    title: str,
    summary: pd.DataFrame,
    rollups: pd.DataFrame,
    hot_keys: pd.DataFrame,
    histograms: pd.DataFrame,
    quality: Quality | None,
    interval: float,
    extra: dict[str, Any],
    answers: pd.DataFrame | None = None,
    top: int = 10,
) -> Path:
    """Write ``out/report.md`` and its plots (PNG, next to it); return the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    parts = [f"# {title}", ""]
    for name, value in extra.items():
        parts.append(f"- {name}: {value}")
    if quality is not None:
        parts += [
            f"- lines read: {quality.lines:,} (blank lines not counted); op events: "
            f"{quality.events:,}; other events skipped: {quality.other:,}; "
            f"**malformed: {quality.malformed:,}**",
        ]
        if quality.schema1:
            parts.append(
                f"- op events of schema 1: {quality.schema1:,} (written before events carried "
                "the answer's error: an error answer there counts as none)"
            )
    parts += ["", "## Summary", "", markdown_table(summary, _SUMMARY_COLUMNS), ""]
    if answers is not None and not answers.empty:
        shown = answers.assign(error=answers["error"].where(answers["error"].notna(), "(none)"))
        parts += [
            "## Outcomes and answers",
            "",
            "Ops by outcome and by the error their answer carried: an op that completed "
            "with an error answer is not a success.",
            "",
            markdown_table(
                shown,
                [
                    ("scenario", "scenario", "str"),
                    ("purgatory", "purgatory", "str"),
                    ("outcome", "outcome", "str"),
                    ("error", "error", "str"),
                    ("ops", "ops", "int"),
                    ("share", "share", "pct"),
                    ("wait_p50", "wait p50 ms", "ms"),
                    ("wait_p99", "wait p99 ms", "ms"),
                    ("wait_max", "wait max ms", "ms"),
                ],
            ),
            "",
        ]

    plots: list[tuple[str, str, Callable[[Path], bool]]] = [
        (
            "wait_by_outcome.png",
            "Wait distribution by outcome and error answer",
            lambda p: _plot_histograms(histograms, "wait", p, "wait (s)", by_outcome=True),
        ),
        (
            "expiries_over_time.png",
            "Expiries (and error answers, dashed) over time",
            lambda p: _plot_expiries(rollups, p, interval),
        ),
        (
            "lateness.png",
            "Expiry lateness (finished_at - deadline)",
            lambda p: _plot_histograms(histograms, "lateness", p, "lateness (s)", by_outcome=False),
        ),
    ]
    parts += ["## Plots", ""]
    for filename, caption, draw in plots:
        if draw(out / filename):
            parts += [f"### {caption}", "", f"![{caption}]({filename})", ""]
        else:
            parts += [f"### {caption}", "", "(no data)", ""]

    if not rollups.empty:
        failing = rollups.assign(_worst=rollups[["expiry_rate", "error_rate"]].max(axis=1))
        worst = failing.sort_values(["_worst", "expired", "errors"], ascending=False).head(10)
        parts += [
            f"## Worst {interval:g} s intervals by expiry or error rate",
            "",
            markdown_table(
                worst,
                [
                    ("scenario", "scenario", "str"),
                    ("purgatory", "purgatory", "str"),
                    ("interval_start", "interval start (s)", "str"),
                    ("ops", "ops", "int"),
                    ("expired", "expired", "int"),
                    ("expiry_rate", "expiry rate", "pct"),
                    ("errors", "error answers", "int"),
                    ("error_rate", "error rate", "pct"),
                    ("wait_p99", "wait p99 ms", "ms"),
                    ("lateness_max", "lateness max ms", "ms"),
                ],
            ),
            "",
        ]
    if not hot_keys.empty:
        key_columns = [
            ("scenario", "scenario", "str"),
            ("purgatory", "purgatory", "str"),
            ("key", "key", "str"),
            ("ops", "ops", "int"),
            ("expired", "expired", "int"),
            ("errors", "error answers", "int"),
            ("wait_p99", "wait p99 ms", "ms"),
        ]
        by_ops = hot_keys[hot_keys["rank_by_ops"] <= top].sort_values(["scenario", "rank_by_ops"])
        by_exp = hot_keys[hot_keys["rank_by_expired"].fillna(1e18) <= top].sort_values(
            ["scenario", "rank_by_expired"]
        )
        parts += [f"## Hot keys by ops (top {top})", "", markdown_table(by_ops, key_columns), ""]
        parts += [f"## Hot keys by expiries (top {top})", ""]
        parts += [markdown_table(by_exp, key_columns) if not by_exp.empty else "(no expiries)", ""]

    if quality is not None and quality.malformed:
        import pandas as pd

        shown = pd.DataFrame(quality.examples[:20])
        parts += [
            f"## Malformed lines ({quality.malformed:,}; first {len(shown)} shown, "
            "all located ones in `malformed/`)",
            "",
            markdown_table(
                shown,
                [
                    ("source", "file", "str"),
                    ("line", "line", "int"),
                    ("problem", "problem", "str"),
                    ("text", "text", "str"),
                ],
            ),
            "",
        ]
    parts += [
        "Percentiles: Spark `percentile_approx` (nearest rank; rank error at most 1/10000 of "
        "the group). Tables: `facts/`, `rollups/`, `summary/`, `answers/`, `hot_keys/` "
        "(Parquet).",
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def print_summary(result: AnalysisResult) -> None:
    """Print a short summary of an analysis with rich (totals per scenario, timings)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # logs and CI: do not squeeze the table to 80 columns
    table = Table(title=f"aiopurgatory: {result.out}", title_justify="left")
    for _, header, kind in _SUMMARY_COLUMNS:
        if header in ("cancelled", "failed", "lateness p99 ms"):
            continue
        table.add_column(header, justify="left" if kind == "str" else "right")
    rows = result.summary
    for row in rows[rows["purgatory"] == "(all)"].to_dict("records"):
        table.add_row(
            *[
                _fmt(row[name], kind)
                for name, header, kind in _SUMMARY_COLUMNS
                if header not in ("cancelled", "failed", "lateness p99 ms")
            ]
        )
    console.print(table)
    quality = result.quality
    if quality is not None:
        style = "bold red" if quality.malformed else "green"
        console.print(
            f"lines {quality.lines:,}  events {quality.events:,}  other {quality.other:,}  "
            f"[{style}]malformed {quality.malformed:,}[/{style}]"
        )
        for example in quality.examples[:5]:
            console.print(
                f"  {example['source']}:{example['line']}: {example['problem']}",
                markup=False,
                highlight=False,
            )
    answers = getattr(result, "answers", None)
    if answers is not None and not answers.empty:
        with_error = answers[answers["error"].notna()]
        for row in with_error.to_dict("records"):
            console.print(
                f"[bold red]error answers[/bold red] {row['scenario']} {row['purgatory']}: "
                f"{row['outcome']} {row['error']}: {row['ops']:,} ops "
                f"({_fmt(row['share'], 'pct')})",
                highlight=False,
            )
    timings = "  ".join(f"{name} {seconds:.1f}s" for name, seconds in result.seconds.items())
    console.print(f"times: {timings}")
    if result.report is not None:
        console.print(f"report: {result.report}")
