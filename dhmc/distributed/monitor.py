"""The one convergence monitor of a run: what ``draws="auto"``, the end-of-run check, the progress bar and the
dashboard all read.

After every complete wave of segments (all chunks have finished segment ``s``) whose draws crossed a
power of :data:`GROWTH` (:data:`FIXED_GROWTH` for fixed draws), the driver looks at the first
:func:`head_chains` chains of every chunk, over all draws so far, and measures every scalar
parameter's bulk and tail ESS (ArviZ's, computed by :mod:`dhmc.stats`) and the ESS of its sd
(:func:`dhmc.stats.ess_sd`: a heavy tail's sd needs more draws than its quantiles), each scaled from the chains
looked at to the whole ensemble, split R-hat and nested R-hat (superchains: the chunks, at most 16 groups of
them). Observers are told each measurement (``convergence_check``). With ``draws="auto"`` the run stops at the
first measured wave where every ESS reaches ``target_ess``, the largest nested R-hat is below :data:`RHAT_MAX`
and the chains have forgotten where sampling began (:func:`start_memory`); a fixed-draws run's last measurement
is its end-of-run check. The decisions depend only on the draws, so they are as deterministic as the draws are.

Why the last test: the ESS of many short chains counts their spread across chains as independent draws, which
they are only once each chain has forgotten its start, warmup's last ensemble. Where warmup handed over a tail
too thin, chains that keep their places keep it thin, and the draws read it light, kurtosis included: the
Brownian motion's observation scale (kurtosis 24.6) read 12.2 +- 1.0 at 10 draws of 1024 chains, its sd's ESS
536 against a target of 400, and stopped there 11% narrow; its chains' distances from the mean at the last draw
correlated 0.30 with the first's (z = 9.7 against a critical 3.9), where the non-centred eight schools' log tau
read 3.2 (critical 3.5) and the other posteriors' scalars 2.0 or less.

With ``draws="auto"`` the sd's ESS is not scaled up to the ensemble as the bulk and tail ESS are: it counts at most
:data:`SD_CHAINS` chains' worth (the ESS of the chains read, times ``SD_CHAINS / chains read`` where more are read).
A heavy tail's sd rests on the few chains that have reached the tail, and while warmup's ensemble hands it over
thin, on how long each chain has run: the bias of the draws' sd falls with the draws per chain, not with the
chains. The monitor reads up to :data:`MAX_CHAINS` chains (all of a 4096-chain run, while their draws fit
``dhmc.monitor-memory``), so that sd ESS is read from all of them, with less noise than from 1024. Reading 1024
of 4096 chains and scaling by 4, the Brownian motion (``laplace=True``) met the sd's target at 50 draws and
stopped 9% narrow; counting all 4096 unscaled, six runs (three seeds, two warmups) stopped at 30-120 draws, every
one narrow (0.944-0.978 of the reference sd, mean 0.967; one failed the 5% check), where 1024 chains' 350-500
draws read 0.968-1.012: that tail needs the draws per chain that 1024 chains run. :func:`start_memory` reads at
most :data:`MEMORY_CHAINS` of them (spread over the chunks), as warmup's paired test does, so more chains bring
no fresh chance to fail it. Runs of up to 1024 chains read them all, and are unchanged.
"""

from __future__ import annotations

import math

import numpy as np
from dask.utils import parse_bytes

from dhmc.distributed import config
from dhmc.distributed.stopping import critical_z
from dhmc.geometry import Geometry
from dhmc.stats import ess_bulk, ess_sd, ess_tail, nested_rhat, split_rhat, superchains

__all__ = ["RHAT_MAX", "SD_CHAINS", "ConvergenceMonitor", "head_chains", "remaining", "start_memory"]

RHAT_MAX = 1.01
MAX_CHAINS = 4096  # the monitor looks at about this many chains, the first of each chunk (nested R-hat's noise
# floor is about sqrt(1 + 1 / (chains per superchain x ESS per chain)): 16 chains per chunk of a
# 1024-chain run and 10 draws sat at 1.01)
SD_CHAINS = 1024  # the sd's ESS counts at most this many chains' worth (see the module's docstring)
MEMORY_CHAINS = 1024  # start_memory reads about this many of them: its z grows as sqrt(chains)
GROWTH = 1.2  # draws="auto" measures waves as the draws grow by 20%: checks cost O(log draws) ...
FIXED_GROWTH = 2.0  # ... a fixed-draws run (only watched) as they double,
FIXED_ESS_CHAINS = 128  # its ESS from this many of the head chains, spread over the chunks (R-hat from all):
# the ESS of 1024 chains x 4000 draws x 10 scalars takes ~13 s (its rank normalization sorts all draws), of 128 ~1 s


def head_chains(geometry: Geometry, draw_bytes: int = 0, budget: int | None = None, draws: int | None = None) -> int:
    """Chains per chunk the monitor looks at: the first ``min(smallest chunk, MAX_CHAINS / chunks)``, at least 1, and
    no more than keep all their ``draws`` (the run's, unless given; ``draw_bytes`` each) within ``budget`` bytes
    (``dhmc.monitor-memory``)."""
    smallest = len(geometry.chunk(geometry.num_chunks - 1))
    k = min(smallest, MAX_CHAINS // geometry.num_chunks)
    if draw_bytes and budget:
        k = min(k, budget // (geometry.num_chunks * (geometry.draws if draws is None else draws) * draw_bytes))
    return max(1, k)


def start_memory(draws: np.ndarray) -> float:
    """Largest z over the scalars of ``draws`` (chains, draws, scalars) of the chains' memory of their first draw:
    the correlation across chains of the first and last draws of ``x`` and of ``|x - mean|``, times
    ``sqrt(chains)`` (a standard normal for chains that forgot their start, for any scalar with a finite variance;
    one-sided: memory is positive).

    The distances' correlation is the one to see a tail the chains have not yet filled: the few chains far out
    carry the variance, and while they stay there, it is theirs. 0 with fewer than 2 draws or 3 chains."""
    chains, n = draws.shape[:2]
    if n < 2 or chains < 3:
        return 0.0
    worst, mean = 0.0, draws.mean(axis=(0, 1))
    ends = draws[:, [0, -1]]  # the two draws compared: no copy of every draw
    for f in (ends, np.abs(ends - mean)):
        first, last = f[:, 0] - f[:, 0].mean(axis=0), f[:, 1] - f[:, 1].mean(axis=0)
        norm = np.sqrt((first * first).sum(axis=0) * (last * last).sum(axis=0))
        r = np.divide((first * last).sum(axis=0), norm, out=np.zeros(norm.shape), where=norm > 0)
        worst = max(worst, float(np.max(r, initial=0.0)) * math.sqrt(chains))
    return worst


def remaining(draws: int, min_ess: float, target_ess: float, max_draws: int) -> int:
    """Draws still to go, extrapolated linearly from the ESS so far (capped at ``max_draws``)."""
    if min_ess >= target_ess:
        return 0
    if not min_ess > 0:
        return max_draws - draws
    return int(min(math.ceil(draws * (target_ess / min_ess - 1)), max_draws - draws))


def labels(name: str, shape: tuple[int, ...]) -> list[str]:
    """Each scalar of variable ``name``: ``name``, ``name[i]``, ``name[i,j]``... in C order."""
    if not shape:
        return [name]
    return [f"{name}[{','.join(map(str, i))}]" for i in np.ndindex(*shape)]


class ConvergenceMonitor:
    """The monitor's state in one run: the head chains, block by block, and the waves checked.

    Parameters
    ----------
    spec
        The run's ``RunSpec`` (with ``target_ess``, ``draws="auto"``: its ``draws`` is ``max_draws``).
    sink
        Its sink, read (``head``) for blocks finished before this run (a resume).
    checked
        ``draws="auto"``: waves an earlier run already checked, none of which met the rule.
    """

    def __init__(self, spec, sink, checked: int = 0):
        self.spec, self.geometry, self.sink = spec, spec.geometry, sink
        self.auto = spec.target_ess is not None
        layout = getattr(sink, "layout", None)
        self.draw_bytes = sum(np.dtype(s.dtype).itemsize * math.prod(s.shape) for s in layout.posterior.values()) \
            if layout is not None else 0
        self.budget = parse_bytes(config.get("monitor-memory"))
        self.heads: dict[tuple[int, int], dict] = {}
        self.waves, self.stopped, self.last = checked, False, None

    def chains_at(self, wave: int) -> int:
        """Chains per chunk the monitor looks at in wave ``wave``: all it would (:func:`head_chains`) while the
        draws so far fit ``dhmc.monitor-memory``, fewer as they grow. A block of segment ``s`` is first
        measured in wave ``s + 1``: the most of its chains any wave looks at."""
        return head_chains(self.geometry, self.draw_bytes, self.budget, self.geometry.draws_in(wave))

    def add(self, chunk: int, segment: int, result) -> None:
        """Keep a finished block's first chains (the worker's ``head``, or its draws)."""
        head = result.head_draws
        if head is not None:
            k = self.chains_at(segment + 1)
            self.heads[chunk, segment] = {name: np.array(v[:k]) for name, v in head.items()}

    def draws(self, wave: int) -> dict[str, np.ndarray]:
        """The head chains' draws of the first ``wave`` segments, chunk after chunk (the heads kept trimmed to what
        this and later waves look at)."""
        k, parts = self.chains_at(wave), []
        for key, block in self.heads.items():
            if next(iter(block.values())).shape[0] > k:
                self.heads[key] = {name: np.array(v[:k]) for name, v in block.items()}
        for chunk in range(self.geometry.num_chunks):
            blocks = [self._head(chunk, s, k) for s in range(wave)]
            parts.append({name: np.concatenate([b[name] for b in blocks], axis=1) for name in blocks[0]})
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    def check(self, wave: int) -> dict | None:
        """Measure the first ``wave`` segments if the wave is due; return what observers are told (None: not due).

        Only waves whose draws cross a power of :data:`GROWTH` are measured (and the last); with
        ``draws="auto"`` the others count as checked and not met, so short segments do not cost a
        check each. Which waves are measured depends on the wave alone, so a resumed run measures
        the same ones.
        """
        if not self.due(wave):
            self._checked(wave)
            return None
        self.last = self.measure(wave)
        if self.last.get("converged"):
            self.stopped = True
        else:
            self._checked(wave)
        return self.last

    def final(self) -> dict:
        """The end-of-run record of a fixed-draws run: ``{"max_rhat", "max_nested_rhat", "worst", "chains",
        "draws", "min_ess"}`` over every segment (the last measurement, if it measured them all)."""
        n = self.geometry.num_segments
        last = self.last if self.last is not None and self.last["draws"] == self.geometry.draws else self.measure(n)
        return {"max_rhat": last["max_split_rhat"], **{k: last[k] for k in ("max_nested_rhat", "worst", "chains",
                                                                             "draws", "min_ess")}}

    def due(self, wave: int) -> bool:
        """Whether wave ``wave`` is measured: the first, the last, and those crossing a power of :data:`GROWTH`
        (for fixed draws, never one of fewer than 4 draws)."""
        geometry = self.geometry
        n, before = geometry.draws_in(wave), geometry.draws_in(wave - 1)
        grid = lambda draws: math.floor(math.log(draws) / math.log(GROWTH if self.auto else FIXED_GROWTH))
        if n < 4 and not self.auto:  # no R-hat (nor a sound ESS) from fewer draws per chain
            return False
        return wave <= 1 or n >= geometry.draws or grid(n) > grid(before)

    def measure(self, wave: int) -> dict:
        """Every scalar's ESS and R-hat over the head chains of the first ``wave`` segments, and their extremes.

        ``params`` maps each scalar (``x[0]``) to ``{"rhat" (split), "nested_rhat", "ess_bulk",
        "ess_tail", "ess_sd"}`` (None where undefined; with ``draws="auto"`` ``ess_sd`` counts at most :data:`SD_CHAINS`
        chains' worth: see the module's docstring). ``min_ess`` (bulk, tail or sd, scaled to the ensemble),
        ``max_split_rhat`` and ``max_nested_rhat`` (at least 1; infinite for chains stuck apart) leave
        out scalars whose values are undefined (constant draws); no ESS at all counts as 0; ``worst``
        names the scalar of the largest split R-hat. With ``draws="auto"`` the record also has
        ``target_ess``, ``max_draws``, ``converged``, ``remaining``, ``max_rhat`` (the rule's: nested), and
        ``start_memory`` (:func:`start_memory` of at most :data:`MEMORY_CHAINS` of the chains read, spread over the
        chunks) with the ``memory_critical`` z it must stay below (Bonferroni over
        the scalars, :func:`~dhmc.distributed.stopping.critical_z`).
        """
        geometry, draws = self.geometry, self.draws(wave)
        n, used = geometry.draws_in(wave), next(iter(draws.values())).shape[0]
        names = [label for name, v in draws.items() for label in labels(name, v.shape[2:])]
        flat = np.concatenate([v.reshape(used, v.shape[1], -1) for v in draws.values()], axis=2)
        groups = superchains(geometry.num_chunks, used)
        sample = flat if self.auto else flat[::max(1, used // FIXED_ESS_CHAINS)]  # ESS is costly: fewer chains
        scale = self.spec.chains / sample.shape[0]
        columns = {"rhat": split_rhat(flat),
                   "nested_rhat": nested_rhat(flat[:used - used % groups], groups) if groups else np.nan,
                   "ess_bulk": ess_bulk(sample) * scale, "ess_tail": ess_tail(sample) * scale,
                   "ess_sd": ess_sd(sample) * (min(1.0, SD_CHAINS / sample.shape[0]) if self.auto else scale)}
        columns = {k: np.broadcast_to(np.asarray(v, float), (len(names),)) for k, v in columns.items()}
        params = {label: {k: _float(v[i]) for k, v in columns.items()} for i, label in enumerate(names)}
        record = {"draws": n, "chains": used, **_extremes(names, columns), "params": params}
        if self.auto:
            memory = start_memory(flat[::math.ceil(used / MEMORY_CHAINS)])
            target, critical = self.spec.target_ess, critical_z(len(names))
            converged = record["min_ess"] >= target and record["max_nested_rhat"] < RHAT_MAX and memory < critical
            left = remaining(n, record["min_ess"], target, geometry.draws)
            if not converged and not left:  # the ESS is there, the rest is not: at least until the next check
                left = min(math.ceil(n * (GROWTH - 1)), geometry.draws - n)
            record.update(target_ess=target, max_draws=geometry.draws, max_rhat=record["max_nested_rhat"],
                          start_memory=memory, memory_critical=critical, converged=converged, remaining=left)
        return record

    def _checked(self, wave: int) -> None:
        self.waves = wave
        if self.auto:
            self.sink.checked(wave)

    def _head(self, chunk: int, segment: int, k: int) -> dict:
        if (chunk, segment) not in self.heads:
            self.heads[chunk, segment] = self.sink.head(chunk, segment, k)
        return self.heads[chunk, segment]


def _float(value) -> float | None:
    """A JSON-able number: None where it is undefined."""
    value = float(value)
    return value if math.isfinite(value) else None


def _extremes(names: list[str], columns: dict[str, np.ndarray]) -> dict:
    """``min_ess`` over bulk, tail and sd, ``max_split_rhat`` and ``max_nested_rhat`` (at least 1, NaN left out) and
    ``worst``, the scalar of the largest split R-hat ("" when none is above 1)."""
    ess = np.concatenate([columns["ess_bulk"], columns["ess_tail"], columns["ess_sd"]])
    ess = ess[np.isfinite(ess)]
    split, nested = columns["rhat"], columns["nested_rhat"]
    known = ~np.isnan(split)
    worst = names[int(np.argmax(np.where(known, split, -np.inf)))] if known.any() and split[known].max() > 1 else ""
    return {"min_ess": float(ess.min()) if ess.size else 0.0, "worst": worst,
            "max_split_rhat": float(max(1.0, np.nanmax(split, initial=1.0))),
            "max_nested_rhat": float(max(1.0, np.nanmax(nested, initial=1.0)))}
