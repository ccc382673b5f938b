"""Running convergence on the driver, from blocks as they arrive: split R-hat and a batch-means ESS.

Only moments are kept (per tracked chain and segment), never draws, so the cost stays small for
any run: at most ``max_chains`` chains and ``max_params`` scalar parameters are followed.
"""

from __future__ import annotations

import numpy as np


class RunningConvergence:
    """Split R-hat and ESS per parameter over the segments completed so far."""

    def __init__(self, chains: int, segments: int, chains_per_task: int, max_chains: int = 256, max_params: int = 16):
        self.tracked = min(chains, max_chains)
        self.cpt, self.segments, self.max_params, self.chains = chains_per_task, segments, max_params, chains
        self.names: list[str] | None = None
        self.count = np.zeros((self.tracked, segments))
        self.mean = self.m2 = None

    def add(self, chunk: int, segment: int, moments: dict) -> None:
        """Fold one block's per-chain moments in (``dhmc.distributed.worker.chain_moments``)."""
        c0 = chunk * self.cpt
        if c0 >= self.tracked:
            return
        mean, m2 = np.asarray(moments["mean"], float), np.asarray(moments["m2"], float)
        rows = slice(c0, min(c0 + mean.shape[0], self.tracked))
        n = rows.stop - rows.start
        if self.names is None:
            self.names = list(moments["names"])
            self.mean = np.zeros((self.tracked, self.segments, mean.shape[-1]))
            self.m2 = np.zeros_like(self.mean)
        self.count[rows, segment] = moments["count"]
        self.mean[rows, segment] = mean[:n]
        self.m2[rows, segment] = m2[:n]

    def report(self) -> dict[str, dict[str, float]]:
        """``{param: {"rhat", "ess_bulk"}}`` over the segments every tracked chain has done."""
        if self.names is None:
            return {}
        done = int((self.count > 0).all(axis=0).cumprod().sum())
        if done < 2:
            return {}
        halves = [self._merge(slice(0, done // 2)), self._merge(slice(done // 2, 2 * (done // 2)))]
        n = np.concatenate([h[0] for h in halves])
        means = np.concatenate([h[1] for h in halves])
        var = np.concatenate([h[2] for h in halves]) / np.maximum(n - 1, 1)[:, None]
        length = n.mean()
        within = var.mean(axis=0)
        between_over_n = means.var(axis=0, ddof=1)
        var_plus = (length - 1) / length * within + between_over_n
        rhat = np.sqrt(var_plus / within)
        tau = np.clip(length * between_over_n / var_plus, 1e-12, None)
        total = self.chains * 2 * length  # draws per chain so far, over the whole ensemble
        ess = total / np.maximum(tau, 1.0)
        pairs = zip(self.names, rhat, ess, strict=True)
        return {name: {"rhat": float(r), "ess_bulk": float(e)} for name, r, e in pairs}

    def _merge(self, segments: slice):
        n = self.count[:, segments]
        total = n.sum(axis=1)
        mean = (n[..., None] * self.mean[:, segments]).sum(axis=1) / total[:, None]
        m2 = (self.m2[:, segments] + n[..., None] * (self.mean[:, segments] - mean[:, None]) ** 2).sum(axis=1)
        return total, mean, m2
