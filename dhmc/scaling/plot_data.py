"""What the scaling plots show, without matplotlib: one series per workload, and the texts beside them."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["chains_knee", "point_note", "study_series", "subtitle"]


def study_series(studies: Sequence[dict]) -> list[tuple[str, list[dict]]]:
    """``(label, runs sorted by workers/chains)`` per model per study."""
    out = []
    many = len(studies) > 1
    for i, study in enumerate(studies):
        by_model: dict[str, list[dict]] = {}
        for run in study["runs"]:
            by_model.setdefault(run.get("model", study.get("model", "?")), []).append(run)
        for model, runs in by_model.items():
            key = "chains" if study["kind"] == "chains" else "workers"
            runs = sorted(runs, key=lambda r: r[key])
            label = model
            if study["kind"] == "strong":
                label += f", {runs[0]['chains']} chains"
            elif study["kind"] == "weak":
                label += f", {runs[0]['chains'] // runs[0]['workers']} chains/worker"
            if many:
                label += f" [{study.get('machine', {}).get('hostname', i)}]" if _hosts_differ(studies) else ""
            out.append((label, runs))
    return out


def point_note(run: dict) -> str:
    """A warning for a point measured while the workers did not get their cores (a busy machine), or one the
    study marked suspect (unequal work, or faster than linear)."""
    share = run.get("cpu_share")
    busy = share is not None and share < 0.75 and run.get("cpu_workers", True)
    note = f"\n(busy: CPU {share:.0%})" if busy else ""
    return note + (f"\n(suspect: {run['suspect']})" if run.get("suspect") else "")


def _hosts_differ(studies) -> bool:
    return len({s.get("machine", {}).get("hostname") for s in studies}) > 1


def subtitle(studies: Sequence[dict]) -> str:
    """The line under a title: draws, cluster, cores, repeats, and hosts that share fewer machines."""
    study = studies[0]
    machine = study.get("machine", {})
    cluster = study.get("cluster") or "local"
    cores = machine.get("cores_available")
    draws = study.get("settings", {}).get("draws") or study["runs"][0]["draws"]
    repeat = study.get("settings", {}).get("repeat")
    bits = [f"{draws} draws", f"cluster {cluster}"]
    if cores and cluster == "local":
        bits.append(f"{cores} cores")
    if repeat:
        bits.append(f"median of {repeat}, bars min-max")
    shared = [r for r in study["runs"] if r.get("machines") and len(r.get("hosts", ())) > r["machines"]]
    if shared:  # hosts that are namespaces or containers of fewer machines share those machines' cores
        run = max(shared, key=lambda r: len(r["hosts"]))
        machines = "one machine's" if run["machines"] == 1 else f"{run['machines']} machines'"
        return ", ".join(bits) + f"\n{len(run['hosts'])} hosts share {machines} {run['machine_cores']} cores"
    return ", ".join(bits)


def chains_knee(runs) -> int | None:
    """The smallest ensemble whose cost per chain-draw is within 2x of the best one's."""
    per = [r["seconds"] / (r["chains"] * r["draws"]) for r in runs]
    if len(per) < 2:
        return None
    best = min(per)
    for r, p in zip(runs, per, strict=True):
        if p <= 2 * best:
            return r["chains"] if r is not runs[0] else None
    return None
