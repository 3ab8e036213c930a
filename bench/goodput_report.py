"""The goodput benchmark's summary over runs and its plot (`bench_goodput.py` writes both)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

PHASES = ("detect_s", "restart_s", "start_up_s", "restore_s", "first_step_s", "redone_s", "lost_s")


def median(values: list[float]) -> float | None:
    """The median, to hundredths; None for no values."""
    return round(statistics.median(values), 2) if values else None


def summarize(runs: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    """An arm over its runs: goodput and committed step (median, and each run's), and per kind
    of fault the median of each phase of the lost seconds over every recovered fault, with how
    many faults were not recovered before the next one. The first run's series stays beside it
    for the plot."""
    results = [r[arm] for r in runs if arm in r]
    lost: dict[str, dict[str, Any]] = {}
    for kind in ("kill", "node-down"):
        cut = [x for r in results for x in r.get("lost") or [] if x and x["kind"] == kind]
        missed = sum(
            1
            for r in results
            for f, x in zip(r.get("faults") or [], r.get("lost") or [], strict=True)
            if x is None and f["kind"] == kind
        )
        lost[kind] = {
            "recovered": len(cut),
            "not_recovered": missed,
            **{ph: median([x[ph] for x in cut if x.get(ph) is not None]) for ph in PHASES},
        }
    goodputs = [r["goodput"] for r in results if r.get("goodput") is not None]
    return {
        "runs": len(results),
        "goodput": median(goodputs),
        "goodput_runs": goodputs,
        "committed_step": median([r["committed_step"] for r in results]),
        "committed_step_runs": [r["committed_step"] for r in results],
        "lost_median": lost,
        "faults": results[0].get("faults") if results else [],
        "committed_over_time": results[0].get("committed_over_time") if results else [],
    }


COLORS = {
    "reference": "0.6",
    "tpujob": "tab:blue",
    "tpujob-full": "tab:cyan",
    "jobset": "tab:orange",
    "jobset-restartjob": "tab:red",
    "jobset-inplace": "tab:purple",
}
PHASE_COLORS = {
    "detect_s": "0.3",
    "restart_s": "tab:orange",
    "start_up_s": "tab:olive",
    "restore_s": "tab:green",
    "first_step_s": "tab:blue",
    "redone_s": "tab:red",
}


def plot(report: dict[str, Any], path: Path) -> None:
    """Committed step over time per arm (when recorded), each arm's goodput, the faults
    marked, and (when cut) the median lost seconds per fault kind by phase, with the limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right, lost) = plt.subplots(1, 3, figsize=(18, 4.5))
    arms = report["arms"]
    for arm, result in arms.items():
        series = result.get("committed_over_time") or []
        if series:
            left.plot(
                [t for t, _ in series], [s for _, s in series], color=COLORS.get(arm), label=arm
            )
        for fault in result.get("faults") or []:
            left.axvline(
                fault["at_s"],
                color=COLORS.get(arm),
                alpha=0.3,
                linestyle="-" if fault["kind"] == "kill" else "--",
            )
    left.set(
        xlabel="seconds since the first committed step",
        ylabel="committed step",
        title="checkpoints (faults: kill solid, node down dashed)",
    )
    if any(r.get("committed_over_time") for r in arms.values()):
        left.legend()
    else:
        left.text(0.5, 0.5, "no time series in this run", ha="center", transform=left.transAxes)
    names = list(arms)
    right.bar(
        names, [arms[n].get("goodput") or 0 for n in names], color=[COLORS.get(n) for n in names]
    )
    right.set(
        ylabel="committed step / reference's",
        ylim=(0, 1.1),
        title=f"goodput after {report['minutes']:g} min, a fault every "
        f"{report['fault_every_s']:g} s",
    )
    _plot_lost(lost, report)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plot_lost(ax: Any, report: dict[str, Any]) -> None:
    """Stacked bars: per arm and kind of fault, the median of each phase of the lost seconds."""
    bars = [
        (f"{arm}\n{kind}", cell)
        for arm, result in report["arms"].items()
        for kind, cell in (result.get("lost_median") or {}).items()
        if cell.get("lost_s") is not None
    ]
    if not bars:
        ax.text(0.5, 0.5, "no lost seconds in this run", ha="center", transform=ax.transAxes)
        return
    bottoms = [0.0] * len(bars)
    for phase, color in PHASE_COLORS.items():
        heights = [cell.get(phase) or 0.0 for _, cell in bars]
        ax.bar(range(len(bars)), heights, bottom=bottoms, color=color, label=phase[:-2])
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    if report.get("limit_s"):
        ax.axhline(report["limit_s"], color="k", linestyle=":", label="limit")
    ax.set_xticks(range(len(bars)), [name for name, _ in bars], fontsize=7)
    ax.set(ylabel="seconds (median per fault)", title="lost seconds per fault")
    ax.legend(fontsize=7)
