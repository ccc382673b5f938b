"""PNG plots of scaling studies (the records ``dhmc.scaling.run_study`` writes to ``scaling.json``).

Figures are built with ``matplotlib.figure.Figure`` (no pyplot state, no display needed). Several
workloads (models, or several studies) share one plot, each normalised to its own smallest-worker time.

- strong / weak: ``speedup.png`` (with the ideal line and the 1x baseline), ``efficiency.png``, and
  ``time.png`` (strong: time vs workers) or ``time_per_chain.png`` (weak: total time and time per chain).
- chains: ``chains.png``: time vs number of chains on one worker, and time per chain-draw, which falls
  while per-task and per-iteration overhead dominates and flattens where the work does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from dhmc.scaling.plot_data import chains_knee, point_note, study_series, subtitle

__all__ = ["load", "plot_study", "plot_studies"]

MARKERS = "osD^vP*X"


def load(path: str | os.PathLike) -> dict:
    """A study from ``scaling.json`` (or the directory holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / "scaling.json"
    return json.loads(path.read_text())


def plot_study(study: dict, out: str | os.PathLike) -> list[Path]:
    """Write the PNGs for one study into ``out``; returns their paths."""
    return plot_studies([study], out)


def plot_studies(studies: Sequence[dict], out: str | os.PathLike) -> list[Path]:
    """Write the PNGs for one or several studies of the same kind into ``out`` (overlaid)."""
    if not studies:
        raise ValueError("no studies to plot")
    kinds = {s["kind"] for s in studies}
    if len(kinds) != 1:
        raise ValueError(f"studies of different kinds cannot share plots: {sorted(kinds)}")
    (kind,) = kinds
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    series = study_series(studies)
    if kind == "chains":
        return [_chains(series, studies, out / "chains.png")]
    paths = [_speedup(series, kind, studies, out / "speedup.png"), _efficiency(series, kind, studies,
                                                                               out / "efficiency.png")]
    if kind == "weak":
        paths.append(_time_per_chain(series, studies, out / "time_per_chain.png"))
    else:
        paths.append(_time(series, studies, out / "time.png"))
    return paths


# -- figures -------------------------------------------------------------------------------------------


def _figure(ncols: int = 1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4 * ncols, 4.8), layout="constrained")
    axes = fig.subplots(1, ncols)
    return fig, axes


def _workers_axis(ax, workers: list[int]) -> None:
    lo, hi = min(workers), max(workers)
    if hi / lo >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(workers)
    ax.set_xticklabels([str(w) for w in workers])
    ax.set_xlabel("workers")
    ax.margins(x=0.12)
    ax.grid(True, alpha=0.3)


def _all_workers(series) -> list[int]:
    return sorted({r["workers"] for _, runs in series for r in runs})


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    return path


def _speedup(series, kind, studies, path: Path) -> Path:
    fig, ax = _figure()
    workers = _all_workers(series)
    lo, hi = min(workers), max(workers)
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="ideal (linear)")
    ax.axhline(1.0, color="grey", ls=":", lw=1.2, label="1x (no speedup)")
    for i, (label, runs) in enumerate(series):
        x = [r["workers"] for r in runs]
        y = [r["speedup"] for r in runs]
        err = [[max(0.0, r["speedup"] - r.get("speedup_min", r["speedup"])) for r in runs],
               [max(0.0, r.get("speedup_max", r["speedup"]) - r["speedup"]) for r in runs]]
        ax.errorbar(x, y, yerr=err, marker=MARKERS[i % len(MARKERS)], capsize=3, label=label)
        for r, xi, yi in zip(runs, x, y, strict=True):
            ax.annotate(f"{yi:.2f}x{point_note(r)}", (xi, yi), textcoords="offset points", xytext=(7, -5), va="top",
                        fontsize=8)
    _workers_axis(ax, workers)
    if hi / lo >= 8:
        ax.set_yscale("log", base=2)
    ax.set_ylim(bottom=min(0.8, *(r["speedup"] * 0.9 for _, runs in series for r in runs)) if hi / lo < 8 else None)
    ax.set_ylabel("speedup (throughput vs. fewest workers)" if kind == "strong" else "scaled speedup  n T(1) / T(n)")
    ax.set_title(f"{kind} scaling: speedup\n{subtitle(studies)}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    return _save(fig, path)


def _efficiency(series, kind, studies, path: Path) -> Path:
    fig, ax = _figure()
    workers = _all_workers(series)
    ax.axhline(1.0, color="k", ls="--", lw=1, label="ideal")
    top = 1.1
    for i, (label, runs) in enumerate(series):
        x = [r["workers"] for r in runs]
        y = [r["efficiency"] for r in runs]
        err = [[max(0.0, r["efficiency"] - r.get("speedup_min", r["speedup"]) / r["workers"]) for r in runs],
               [max(0.0, r.get("speedup_max", r["speedup"]) / r["workers"] - r["efficiency"]) for r in runs]]
        ax.errorbar(x, y, yerr=err, marker=MARKERS[i % len(MARKERS)], capsize=3, label=label)
        for r, xi, yi in zip(runs, x, y, strict=True):
            ax.annotate(f"{yi:.0%}{point_note(r)}", (xi, yi), textcoords="offset points", xytext=(7, -5), va="top",
                        fontsize=8)
        top = max(top, *(r.get("speedup_max", r["speedup"]) / r["workers"] * 1.05 for r in runs))
    _workers_axis(ax, workers)
    ax.set_ylim(0.0, top)
    ax.yaxis.set_major_formatter(_percent())
    ax.set_ylabel("parallel efficiency  speedup / workers")
    ax.set_title(f"{kind} scaling: parallel efficiency\n{subtitle(studies)}", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    return _save(fig, path)


def _time(series, studies, path: Path) -> Path:
    fig, ax = _figure()
    workers = _all_workers(series)
    for i, (label, runs) in enumerate(series):
        x = [r["workers"] for r in runs]
        y = [r["seconds"] for r in runs]
        err = [[r["seconds"] - r["seconds_min"] for r in runs], [r["seconds_max"] - r["seconds"] for r in runs]]
        line = ax.errorbar(x, y, yerr=err, marker=MARKERS[i % len(MARKERS)], capsize=3, label=label)
        w0, t0 = runs[0]["workers"], runs[0]["seconds"]
        ax.plot(x, [t0 * w0 / w for w in x], ls="--", lw=1, color=line[0].get_color(), alpha=0.6,
                label=("ideal T(1)/n (dashed)" if w0 == 1 else f"ideal T({w0}) {w0}/n (dashed)")
                if i == 0 else "_nolegend_")
    _workers_axis(ax, workers)
    ax.set_yscale("log")
    _plain_log(ax)
    ax.set_ylabel("sampling time [s]")
    ax.set_title(f"strong scaling: time to sample\n{subtitle(studies)}", fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _time_per_chain(series, studies, path: Path) -> Path:
    fig, (left, right) = _figure(2)
    workers = _all_workers(series)
    for i, (label, runs) in enumerate(series):
        x = [r["workers"] for r in runs]
        marker = MARKERS[i % len(MARKERS)]
        t = [r["seconds"] for r in runs]
        err = [[r["seconds"] - r["seconds_min"] for r in runs], [r["seconds_max"] - r["seconds"] for r in runs]]
        line = left.errorbar(x, t, yerr=err, marker=marker, capsize=3, label=label)
        color = line[0].get_color()
        left.axhline(runs[0]["seconds"], color=color, ls="--", lw=1, alpha=0.6,
                     label="ideal: flat (dashed)" if i == 0 else "_nolegend_")
        per = [1e3 * r["seconds"] / r["chains"] for r in runs]
        per_err = [[1e3 * (r["seconds"] - r["seconds_min"]) / r["chains"] for r in runs],
                   [1e3 * (r["seconds_max"] - r["seconds"]) / r["chains"] for r in runs]]
        right.errorbar(x, per, yerr=per_err, marker=marker, capsize=3, color=color, label=label)
        w0 = runs[0]["workers"]
        right.plot(x, [per[0] * w0 / w for w in x], ls="--", lw=1, color=color, alpha=0.6,
                   label="ideal: 1/n (dashed)" if i == 0 else "_nolegend_")
    for ax in (left, right):
        _workers_axis(ax, workers)
    left.set_ylim(bottom=0)
    left.set_ylabel("sampling time [s]  (ideal: flat, dashed)")
    left.set_title("weak scaling: total time", fontsize=10)
    right.set_yscale("log")
    _plain_log(right)
    right.set_ylabel("time per chain [ms]")
    right.set_title("weak scaling: time per chain", fontsize=10)
    left.legend(fontsize=8, loc="lower left")
    right.legend(fontsize=8)
    fig.suptitle(subtitle(studies), fontsize=9)
    return _save(fig, path)


def _chains(series, studies, path: Path) -> Path:
    fig, (left, right) = _figure(2)
    for i, (label, runs) in enumerate(series):
        marker = MARKERS[i % len(MARKERS)]
        x = [r["chains"] for r in runs]
        t = [r["seconds"] for r in runs]
        err = [[r["seconds"] - r["seconds_min"] for r in runs], [r["seconds_max"] - r["seconds"] for r in runs]]
        line = left.errorbar(x, t, yerr=err, marker=marker, capsize=3, label=label)
        color = line[0].get_color()
        # linear in chains through the largest ensemble: where the curve meets it, the work dominates
        left.plot(x, [t[-1] * c / x[-1] for c in x], ls="--", lw=1, color=color, alpha=0.6,
                  label="linear in chains (dashed)" if i == 0 else "_nolegend_")
        per = [1e6 * r["seconds"] / (r["chains"] * r["draws"]) for r in runs]
        right.plot(x, per, marker=marker, color=color, label=label)
        knee = chains_knee(runs)
        if knee is not None:
            right.axvline(knee, color=color, ls=":", lw=1.2)
            right.annotate(f"overhead < work\nfrom ~{knee} chains", (knee, max(per)), textcoords="offset points",
                           xytext=(4, -24), fontsize=8, color=color)
    sizes = sorted({r["chains"] for _, runs in series for r in runs})
    ticks = sizes if len(sizes) <= 10 else sizes[::2]
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{c:,}" for c in ticks], rotation=45 if len(ticks) > 6 else 0, fontsize=8)
        ax.xaxis.set_minor_formatter(_null())
        _plain_log(ax)
        ax.set_xlabel(f"chains in one block, {studies[0]['runs'][0]['workers']} worker")
        ax.grid(True, which="both", alpha=0.3)
    left.set_ylabel("sampling time [s]")
    left.set_title("time vs number of chains", fontsize=10)
    right.set_ylabel("time per chain-draw [µs]")
    right.set_title("cost per chain-draw (flat: the work dominates)", fontsize=10)
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.suptitle(subtitle(studies), fontsize=9)
    return _save(fig, path)


def _plain_log(ax, axis: str = "y") -> None:
    """Tick labels like 0.2, 3, 40 on a log axis (not 2 x 10^-1)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    target = ax.yaxis if axis == "y" else ax.xaxis
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    target.set_major_formatter(fmt)
    # label the minor ticks (2, 3, ... 9 x 10^k) only where the axis spans little more than a decade
    target.set_minor_formatter(fmt if lo > 0 and hi / lo < 30 else NullFormatter())


def _null():
    from matplotlib.ticker import NullFormatter

    return NullFormatter()


def _percent():
    from matplotlib.ticker import PercentFormatter

    return PercentFormatter(1.0)
