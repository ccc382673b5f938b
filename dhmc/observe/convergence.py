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

    def add(self, chunk: int, segment: int, posterior: dict[str, np.ndarray]) -> None:
        """Fold one block's constrained draws ``{name: (chains, draws, ...)}`` in."""
        c0 = chunk * self.cpt
        if c0 >= self.tracked:
            return
        flat, names = [], []
        for name, values in posterior.items():
            v = np.asarray(values, float).reshape(values.shape[0], values.shape[1], -1)
            for i in range(v.shape[2]):
                names.append(name if v.shape[2] == 1 and values.ndim == 2 else f"{name}[{i}]")
                flat.append(v[..., i])
        x = np.stack(flat[: self.max_params], axis=-1)[: self.tracked - c0]
        if self.names is None:
            self.names = names[: self.max_params]
            self.mean = np.zeros((self.tracked, self.segments, x.shape[-1]))
            self.m2 = np.zeros_like(self.mean)
        rows = slice(c0, c0 + x.shape[0])
        self.count[rows, segment] = x.shape[1]
        self.mean[rows, segment] = x.mean(axis=1)
        self.m2[rows, segment] = ((x - x.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)

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
