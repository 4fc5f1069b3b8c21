"""Plots of a benchmark report (matplotlib, Agg backend, PNG).

One figure with a panel per part of the report that is present: timer lateness
histograms, purgatory expiry-lateness histograms, CPU per request of the
purgatory rate sweep, the scaling curve (CPU per add+cancel against pending
timers, log x) and the acks=all curves (CPU per trigger against pending requests
per partition, log-log).
"""

from __future__ import annotations

from typing import Any

__all__ = ["plot_report"]


def _hist_panel(ax: Any, cells: list[dict[str, Any]], key: str, title: str) -> None:
    for c in cells:
        hist = c["median"].get(f"{key}.hist")
        if hist is None or not sum(hist["counts"]):
            continue
        edges_ms = [e * 1000.0 for e in hist["edges"]]
        label = f"{c['impl']} / {c['loop']}"
        if "scenario" in c:
            label += f" / {c['scenario']}"
        ax.stairs(hist["counts"], edges_ms, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("lateness (ms, log)")
    ax.set_ylabel("count (all repeats)")
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def _acks_panel(ax: Any, acks: dict[str, Any]) -> None:
    """CPU per trigger against pending requests per partition, log-log, a line per impl."""
    curves: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for c in acks["cells"]:
        curves.setdefault((c["impl"], c["loop"]), []).append(
            (c["pending"], c["median"]["cpu_us_per_trigger"])
        )
    # One colour per implementation, one line style per loop.
    colours = {impl: f"C{i}" for i, impl in enumerate(dict.fromkeys(i for i, _ in curves))}
    styles = {"asyncio": "-", "uvloop": "--"}
    for (impl, loop), xy in curves.items():
        xy.sort()
        ax.plot(
            [x for x, _ in xy],
            [y for _, y in xy],
            styles.get(loop, ":"),
            color=colours[impl],
            marker="o",
            label=f"{impl} / {loop}",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import ScalarFormatter

    ax.yaxis.set_major_formatter(ScalarFormatter())
    params = acks["params"]
    ax.set_xlabel("pending produce requests per partition (log)")
    ax.set_ylabel("CPU per trigger (us, log)")
    ax.set_title(
        f"acks=all: {params.get('partitions')} partitions, high watermark "
        f"+{params.get('step')} per trigger, tasks awaiting"
    )
    # Room above the curves for the legend.
    top = max(y for xy in curves.values() for _, y in xy)
    ax.set_ylim(top=top * 40)
    ax.legend(fontsize="x-small", ncol=2, loc="upper left")


def plot_report(report: dict[str, Any], path: str) -> None:
    """Draw the panels that ``report`` has data for and save them to ``path``.

    Raises:
        ValueError: the report has nothing to plot.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    if "timer" in report:
        panels.append("timer")
    if "purgatory" in report:
        panels.append("purgatory")
        if "sweep" in report["purgatory"]:
            panels.append("sweep")
    if "scale" in report:
        panels.append("scale")
    if "acks" in report:
        panels.append("acks")
    if not panels:
        raise ValueError("the report has no benchmark results to plot")
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 4 * len(panels)), squeeze=False)
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        if panel == "timer":
            t = report["timer"]
            _hist_panel(
                ax, t["cells"], "lateness", f"bench timer: lateness (n={t['params']['n']:,})"
            )
        elif panel == "purgatory":
            _hist_panel(
                ax,
                report["purgatory"]["cells"],
                "expiry_lateness",
                "bench purgatory: expiry lateness",
            )
        elif panel == "sweep":
            points = report["purgatory"]["sweep"]["points"]
            series: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for p in points:
                series.setdefault((p["impl"], p["loop"]), []).append(p)
            for (impl, loop), ps in series.items():
                ax.plot(
                    [p["target_rate"] / 1000 for p in ps],
                    [p["cpu_us_per_request"] for p in ps],
                    marker="o",
                    label=f"{impl} / {loop}",
                )
            ax.set_xlabel("target rate (k req/s)")
            ax.set_ylabel("CPU per request (us)")
            ax.set_title("bench purgatory: rate sweep (last point of a line: first rate missed)")
            ax.legend(fontsize="small")
        elif panel == "acks":
            _acks_panel(ax, report["acks"])
        else:
            cells = report["scale"]["cells"]
            curves: dict[tuple[str, str], list[tuple[int, float]]] = {}
            for c in cells:
                curves.setdefault((c["impl"], c["loop"]), []).append(
                    (c["pending"], c["median"]["cpu_ns_per_op"])
                )
            for (impl, loop), xy in curves.items():
                xy.sort()
                ax.plot(
                    [x for x, _ in xy], [y for _, y in xy], marker="o", label=f"{impl} / {loop}"
                )
            ax.set_xscale("log")
            ax.set_ylim(bottom=0)
            ax.set_xlabel("pending timers (log)")
            ax.set_ylabel("CPU per add+cancel (ns)")
            ax.set_title("bench scale")
            ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
