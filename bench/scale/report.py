"""Summaries across runs (median and spread, ratios against JobSet) and one plot per scenario."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from scale.stats import spread

BASELINE = "jobset"
COLORS = {
    "tpujob": "tab:blue",
    "tpujob-kueue": "tab:cyan",
    "jobset": "tab:orange",
    "jobset-kueue": "tab:red",
    "job": "tab:green",
}


def _get(run: dict[str, Any], path: str) -> Any:
    cur: Any = run
    for key in path.split("."):
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    return cur


FIGURES = {
    "ladder": [
        "create_to_running_s.p50",
        "create_to_running_s.p99",
        "create_to_running_s.max",
        "makespan_s",
        "pods_per_s",
        "workloads_running",
        "pods_running_at_end",
        "pools_used",
        "pools_shared",
        "cost.controller_cpu_seconds",
        "cost.controller_peak_rss_mib",
        "cost.arm_requests",
        "cost.processes.kube-apiserver.cpu_seconds",
    ],
    "drain": [
        "create_to_running_s.p50",
        "create_to_running_s.p99",
        "makespan_s",
        "pods_per_s",
        "workloads_done",
        "cost.controller_cpu_seconds",
        "cost.controller_peak_rss_mib",
        "cost.arm_requests",
        "cost.processes.kube-apiserver.cpu_seconds",
    ],
    "recovery": [
        "workloads_running_before_faults",
        "pods_failed.faults",
        "pods_failed.workloads_affected",
        "pods_failed.fault_to_running_s.p50",
        "pods_failed.fault_to_running_s.p99",
        "pods_failed.fault_to_running_s.max",
        "pods_failed.not_recovered",
        "nodes_lost.faults",
        "nodes_lost.workloads_affected",
        "nodes_lost.fault_to_running_s.p50",
        "nodes_lost.fault_to_running_s.p99",
        "nodes_lost.fault_to_running_s.max",
        "nodes_lost.not_recovered",
        "pods_failed.cost.controller_cpu_seconds",
        "pods_failed.cost.arm_requests",
        "nodes_lost.cost.controller_cpu_seconds",
        "nodes_lost.cost.arm_requests",
    ],
}


def summarize(scenario: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """size -> arm -> figure -> median/min/max over runs, plus ratios to the baseline arm."""
    out: dict[str, Any] = {}
    for size in sorted({r["size"] for r in runs}):
        by_arm: dict[str, Any] = {}
        for arm in sorted({r["arm"] for r in runs if r["size"] == size}):
            mine = [
                r["result"] for r in runs if r["size"] == size and r["arm"] == arm and "result" in r
            ]
            errors = [
                r["error"] for r in runs if r["size"] == size and r["arm"] == arm and "error" in r
            ]
            by_arm[arm] = {f: spread([_get(m, f) for m in mine]) for f in FIGURES[scenario]}
            by_arm[arm]["errors"] = errors
        base = by_arm.get(BASELINE)
        if base:
            for arm, figs in by_arm.items():
                if arm == BASELINE:
                    continue
                figs["ratio_to_jobset"] = {
                    f: round(figs[f]["median"] / base[f]["median"], 3)
                    for f in FIGURES[scenario]
                    if figs[f]["median"] is not None and base[f]["median"]
                }
        out[str(size)] = by_arm
    return out


def plot(scenario: str, runs: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    arms = sorted({r["arm"] for r in runs})
    if scenario == "ladder":
        largest = max((int(s) for s in summary), default=0)
        for arm in arms:
            sizes = sorted(int(s) for s in summary if arm in summary[s])
            for q, style in (("p50", "-o"), ("p99", "--s")):
                cells = [summary[str(s)][arm][f"create_to_running_s.{q}"] for s in sizes]
                ys, low, high = _error_bars(cells)
                axes[0].errorbar(
                    sizes,
                    ys,
                    yerr=[low, high],
                    fmt=style,
                    capsize=4,
                    color=COLORS.get(arm),
                    label=f"{arm} {q}",
                )
            # Every run of the largest size: how the pods came up, not only when the last did.
            for r in runs:
                if r["arm"] == arm and r["size"] == largest and "result" in r:
                    _curve(axes[1], r, r["result"].get("running_pods_over_time") or [])
                    _stages(axes[1], r, r["result"].get("pod_stages_over_time") or [])
        axes[0].set(
            xlabel="pools = workloads created at once",
            ylabel="create -> all pods Running (s)",
            title="latency (median of runs, bars: min-max; workloads that ran)",
        )
        axes[1].set(
            xlabel="seconds since the creates",
            ylabel="pods Running (thin: created, bound, refused a node)",
            title=f"pods Running over time, size {largest}, every run",
        )
    elif scenario == "drain":
        for r in runs:
            if "result" not in r:
                continue
            res = r["result"]
            # [seconds, workloads done so far]; older files kept every time (one per workload)
            curve = res.get("done_over_time") or [
                [t, i + 1] for i, t in enumerate(res.get("done_times_s", []))
            ]
            _curve(axes[0], r, curve)
        axes[0].set(
            xlabel="seconds since the creates",
            ylabel="workloads done",
            title="workloads done over time",
        )
        _bars(axes[1], summary, arms, ["makespan_s"], "makespan (s)")
    else:
        _bars(
            axes[0],
            summary,
            arms,
            [
                "pods_failed.fault_to_running_s.p50",
                "pods_failed.fault_to_running_s.p99",
                "pods_failed.fault_to_running_s.max",
            ],
            "5 % of pods failed: fault -> running again (s)",
        )
        _bars(
            axes[1],
            summary,
            arms,
            [
                "nodes_lost.fault_to_running_s.p50",
                "nodes_lost.fault_to_running_s.p99",
                "nodes_lost.fault_to_running_s.max",
            ],
            "2 % of nodes lost: fault -> running again (s)",
        )
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"scale: {scenario}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _curve(ax: Any, run: dict[str, Any], curve: list[list[float]]) -> None:
    """One run's [seconds, count] series, in its arm's colour."""
    ax.plot(
        [c[0] for c in curve],
        [c[1] for c in curve],
        color=COLORS.get(run["arm"]),
        alpha=0.8,
        label=f"{run['arm']} run {run['run']}",
    )


def _stages(ax: Any, run: dict[str, Any], stages: list[list[float]]) -> None:
    """One run's pods created (dotted), bound (dashed) and refused a node by the scheduler
    (dash-dot), thin, in its arm's colour."""
    for column, style in ((1, ":"), (2, "--"), (4, "-.")):
        ax.plot(
            [s[0] for s in stages],
            [s[column] for s in stages],
            style,
            color=COLORS.get(run["arm"]),
            alpha=0.6,
            linewidth=0.8,
        )


def _error_bars(cells: list[dict[str, Any]]) -> tuple[list[float], list[float], list[float]]:
    """Medians over runs and their distances to the min and max (NaN and 0 where none)."""
    ys, low, high = [], [], []
    for c in cells:
        m = c.get("median")
        ys.append(float("nan") if m is None else float(m))
        low.append(0.0 if m is None else float(m) - float(c.get("min", m)))
        high.append(0.0 if m is None else float(c.get("max", m)) - float(m))
    return ys, low, high


def _bars(ax: Any, summary: dict[str, Any], arms: list[str], figs: list[str], title: str) -> None:
    size = max(summary, key=int)
    width = 0.8 / max(1, len(arms))
    for k, arm in enumerate(arms):
        cell = summary[size].get(arm, {})
        xs = [i + k * width for i in range(len(figs))]
        heights, low, high = _error_bars([cell.get(f) or {} for f in figs])
        missing = [math.isnan(h) for h in heights]  # no run had the figure
        ax.bar(
            xs,
            [0.0 if m else h for h, m in zip(heights, missing, strict=True)],
            width,
            yerr=[low, high],
            capsize=3,
            color=COLORS.get(arm),
            label=arm,
        )
        for x, m in zip(xs, missing, strict=True):
            if m:
                ax.text(x, 0, "none", ha="center", va="bottom", fontsize=7, rotation=90)
    ax.set_xticks(
        [i + width * (len(arms) - 1) / 2 for i in range(len(figs))],
        [f.rsplit(".", 1)[-1] for f in figs],
    )
    ax.set(title=f"{title}, size {size}")


def markdown(scenario: str, summary: dict[str, Any]) -> str:
    """A table per size: each figure's median over runs and [min, max] per arm."""
    lines: list[str] = []
    for size, by_arm in summary.items():
        arms = sorted(by_arm)
        lines += [
            f"\n{scenario}, size {size}\n",
            "| figure | " + " | ".join(arms) + " |",
            "|---" * (len(arms) + 1) + "|",
        ]
        for fig in FIGURES[scenario]:
            cells = []
            for arm in arms:
                s = by_arm[arm][fig]
                if s["median"] is None:
                    cells.append(
                        "none" + (f" ({s['runs_without']}/{s['runs']} runs)" if s["runs"] else "")
                    )
                elif s["runs"] > 1:
                    cells.append(f"{s['median']:g} [{s['min']:g}, {s['max']:g}]")
                else:
                    cells.append(f"{s['median']:g}")
            lines.append(f"| {fig} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
