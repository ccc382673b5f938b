"""Three of the LAPS paper's targets that need no download, written here in JAX with data made from a fixed seed,
and their references (made once by ``python -m benchmarks.laps_targets``, kept in ``benchmarks/references/``).

* ``icg100``: a 100-D ill-conditioned Gaussian, covariance eigenvalues Gamma(shape 0.5) draws in a random
  rotation (inference-gym's recipe); its moments are exact.
* ``brownian``: Brownian motion with unknown scales and the middle 10 of 30 observations missing (inference-gym's
  ``BrownianMotionUnknownScalesMissingMiddleObservations``): innovation and observation noise scales with
  LogNormal(0, 2) priors (sampled as their logs), 30 positions; 32-D. Data simulated with scales 0.1 and 0.15.
* ``irt``: inference-gym's ``SyntheticItemResponseTheory``, the LAPS paper's own 501-D target: 400 students'
  abilities N(0, 1), 100 questions' difficulties N(0, 1), a mean ability N(0.75, 1), 30,012 answered pairs of
  the 40,000, ``P(correct) = sigmoid(mean + ability - difficulty)``. Its data (``references/irt_data.npz``) and
  reference are inference-gym's (Apache-2.0; copied by :func:`import_gym_irt`).

The ICG's and the Brownian motion's data are ours, made from a fixed seed (nothing is downloaded), so those two
are not the paper's targets bit for bit; the geometry is. References (kept in ``references/``): every quantity's
mean, sd, Monte Carlo error of the mean, E[x^2] and Var[x^2].

* ``brownian``'s is exact: given the two scales the positions are jointly Gaussian, so the scales' posterior is a
  2-D integral of the marginal likelihood (a midpoint rule on a 0.01 grid; halving the grid moves nothing past
  1e-11) and the positions' moments are those of the Gaussian conditionals, integrated on the same grid. (A
  NumPyro NUTS reference, 4 x 50,000 draws with a dense metric, was 7.8 of its own standard errors off on the
  innovation scale and 20% narrow: it does not enter the funnel's neck.)
* ``irt``'s is inference-gym's ground truth (Stan, 50,000 draws): each quantity's mean, its standard error and
  sd; E[x^2] and Var[x^2] as for a normal marginal of that mean and sd (the posterior is close to Gaussian: 30,012
  Bernoulli observations on 501 parameters).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REFERENCES = Path(__file__).resolve().parent / "references"
NAMES = ("icg100", "brownian", "irt")
BROWNIAN_STEPS, BROWNIAN_MISSING = 30, slice(10, 20)
IRT_STUDENTS, IRT_QUESTIONS = 400, 100


def icg_covariance(d: int = 100, seed: int = 10):
    import numpy as np

    rng = np.random.default_rng(seed)
    eigenvalues = np.sort(rng.gamma(0.5, 1.0, size=d))
    q, r = np.linalg.qr(rng.normal(size=(d, d)))
    q = q * np.sign(np.diag(r))
    return (q * eigenvalues) @ q.T, eigenvalues


def brownian_data(seed: int = 1):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = np.cumsum(rng.normal(0.0, 0.1, BROWNIAN_STEPS))
    y = x + rng.normal(0.0, 0.15, BROWNIAN_STEPS)
    observed = np.ones(BROWNIAN_STEPS, bool)
    observed[BROWNIAN_MISSING] = False
    return y, observed


def irt_data():
    """``(correct, answered)``: inference-gym's synthetic answers as dense ``(400, 100)`` arrays, ``answered`` the
    30,012 pairs it has."""
    import numpy as np

    data = np.load(REFERENCES / "irt_data.npz")
    return data["correct"].astype(np.float32), data["answered"]


def target(name: str):
    """``(logdensity(position dict), init dict)`` of a target."""
    import jax.numpy as jnp
    import numpy as np
    from jax.scipy.stats import norm

    if name == "icg100":
        cov, _ = icg_covariance()
        precision = np.linalg.inv(cov)
        precision = 0.5 * (precision + precision.T)

        def logdensity(p):
            x = p["x"]
            return -0.5 * x @ jnp.asarray(precision, x.dtype) @ x

        return logdensity, {"x": np.zeros(cov.shape[0])}
    if name == "brownian":
        y, observed = brownian_data()

        def logdensity(p):
            x, li, lo = p["x"], p["log_innovation"], p["log_observation"]
            lp = norm.logpdf(li, 0.0, 2.0) + norm.logpdf(lo, 0.0, 2.0)  # LogNormal(0, 2) scales, as their logs
            steps = jnp.diff(x, prepend=jnp.zeros((1,), x.dtype))
            lp += jnp.sum(norm.logpdf(steps, 0.0, jnp.exp(li)))
            lp += jnp.sum(jnp.where(jnp.asarray(observed), norm.logpdf(jnp.asarray(y, x.dtype), x, jnp.exp(lo)), 0.0))
            return lp

        return logdensity, {"x": np.zeros(BROWNIAN_STEPS), "log_innovation": np.zeros(()),
                            "log_observation": np.zeros(())}
    if name == "irt":
        correct, answered = irt_data()

        def logdensity(p):
            ability, difficulty, mean = p["ability"], p["difficulty"], p["mean_ability"]
            logits = mean + ability[:, None] - difficulty[None, :]
            a = jnp.asarray(correct, logits.dtype)
            lp = jnp.sum(jnp.where(jnp.asarray(answered), a * logits - jnp.logaddexp(0.0, logits), 0.0))
            return lp - 0.5 * (jnp.sum(ability**2) + jnp.sum(difficulty**2) + (mean - 0.75) ** 2)

        return logdensity, {"ability": np.zeros(IRT_STUDENTS), "difficulty": np.zeros(IRT_QUESTIONS),
                            "mean_ability": np.zeros(())}
    raise KeyError(name)


def brownian_model():
    """``brownian`` as a NumPyro model, written as its users would: the 30 steps drawn at the innovation scale (a
    centred hierarchy, which ``dhmc.sample(..., noncentered=True)`` non-centres), the positions their running sum."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    y, observed = brownian_data()
    log_innovation = numpyro.sample("log_innovation", dist.Normal(0.0, 2.0))
    log_observation = numpyro.sample("log_observation", dist.Normal(0.0, 2.0))
    steps = numpyro.sample("steps", dist.Normal(0.0, jnp.exp(log_innovation)).expand([BROWNIAN_STEPS]).to_event(1))
    x = numpyro.deterministic("x", jnp.cumsum(steps))
    numpyro.sample("y", dist.Normal(x[observed], jnp.exp(log_observation)).to_event(1), obs=y[observed])


def reference(name: str) -> dict:
    """``{quantity: (mean, sd, mcse of the mean, E[x^2], Var[x^2])}``: exact for ``icg100`` (mcse 0), else the kept
    reference's."""
    import numpy as np

    if name == "icg100":
        var = np.diag(icg_covariance()[0])
        return {f"x[{i}]": (0.0, float(math.sqrt(v)), 0.0, float(v), float(2 * v * v)) for i, v in enumerate(var)}
    path = REFERENCES / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"no reference for {name!r} in {REFERENCES}: make it with python -m benchmarks.laps_targets "
                         f"{name}")
    data = json.loads(path.read_text())
    return {k: tuple(v) for k, v in data["moments"].items()}


def brownian_grid(h: float = 0.01) -> dict:
    """``brownian``'s log scales' posterior on a midpoint grid of step ``h`` (log scales in [-16, 4] x [-12, 3]; the
    mass at its edges is under 1e-10): ``log_innovation``, ``log_observation`` (the grid) and ``weights`` (summing to
    1), with what the positions' Gaussian conditionals need: ``covariance`` (the positions', per unit innovation
    variance), ``loadings`` (``covariance[:, observed] @ u``), ``rotated`` (the observations, ``u^T y``) and
    ``eigenvalues`` (of the observations' covariance at each grid point), ``u`` the eigenvectors of the observed
    positions' covariance and ``spectrum`` its eigenvalues (per unit innovation variance)."""
    import numpy as np

    y, observed = brownian_data()
    t = np.arange(BROWNIAN_STEPS)
    cov = np.minimum.outer(t, t) + 1.0
    obs = np.flatnonzero(observed)
    lam, u = np.linalg.eigh(cov[np.ix_(obs, obs)])
    y_rot = u.T @ y[obs]
    li, lo = np.meshgrid(np.arange(-16 + h / 2, 4, h), np.arange(-12 + h / 2, 3, h), indexing="ij")
    d = np.exp(2 * li)[..., None] * lam + np.exp(2 * lo)[..., None]
    logp = -li**2 / 8 - lo**2 / 8 - 0.5 * np.log(d).sum(-1) - 0.5 * (y_rot**2 / d).sum(-1)
    w = np.exp(logp - logp.max())
    w /= w.sum()
    return {"log_innovation": li, "log_observation": lo, "weights": w, "covariance": cov,
            "loadings": cov[:, obs] @ u, "rotated": y_rot, "eigenvalues": d, "spectrum": lam}


def brownian_exact(h: float = 0.01) -> dict:
    """``brownian``'s reference by quadrature: the scales' posterior on :func:`brownian_grid`, the positions'
    moments from their Gaussian conditionals."""
    import numpy as np

    grid = brownian_grid(h)
    li, lo, w, cov = grid["log_innovation"], grid["log_observation"], grid["weights"], grid["covariance"]
    a, y_rot, d = grid["loadings"], grid["rotated"], grid["eigenvalues"]
    si2 = np.exp(2 * li)[..., None]
    moments = {}
    for name, v in (("log_innovation", li), ("log_observation", lo)):
        m1, m2, m4 = (w * v).sum(), (w * v**2).sum(), (w * v**4).sum()
        moments[name] = (m1, math.sqrt(m2 - m1**2), 0.0, m2, m4 - m2**2)
    mean = si2 * np.einsum("tk,ijk->ijt", a, y_rot / d)
    var = si2 * cov.diagonal() - si2**2 * np.einsum("tk,ijk->ijt", a**2, 1 / d)
    for i in range(BROWNIAN_STEPS):
        m, v = mean[..., i], var[..., i]
        m1, m2 = (w * m).sum(), (w * (m**2 + v)).sum()
        m4 = (w * (m**4 + 6 * m**2 * v + 3 * v**2)).sum()
        moments[f"x[{i}]"] = (m1, math.sqrt(m2 - m1**2), 0.0, m2, m4 - m2**2)
    return {"target": "brownian", "sampler": f"exact: quadrature on a {h} grid of the log scales",
            "moments": {k: [float(x) for x in v] for k, v in moments.items()}}


def import_gym_irt(gym_root: Path) -> dict:
    """Copy inference-gym's ``SyntheticItemResponseTheory`` data to ``references/irt_data.npz`` and return its
    reference from the ground truth module, read from an inference-gym source tree (``gym_root``: the folder of
    ``inference_gym``; its modules are read as files, nothing of TensorFlow Probability is imported)."""
    import importlib.util

    import numpy as np

    def module(relative: str):
        spec = importlib.util.spec_from_file_location(relative.replace("/", "_"), gym_root / relative)
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        return loaded

    data = module("internal/datasets/synthetic_item_response_theory.py")
    correct = np.zeros((IRT_STUDENTS, IRT_QUESTIONS), np.int8)
    answered = np.zeros((IRT_STUDENTS, IRT_QUESTIONS), bool)
    correct[data.STUDENT_IDS, data.QUESTION_IDS] = data.CORRECT
    answered[data.STUDENT_IDS, data.QUESTION_IDS] = True
    np.savez_compressed(REFERENCES / "irt_data.npz", correct=correct, answered=answered)
    truth = module("targets/ground_truth/synthetic_item_response_theory.py")
    moments = {}
    for ours, theirs in (("mean_ability", "MEAN_STUDENT_ABILITY"), ("ability", "CENTERED_STUDENT_ABILITY"),
                         ("difficulty", "QUESTION_DIFFICULTY")):
        mean, sd, error = (np.atleast_1d(getattr(truth, f"IDENTITY_{theirs}_{k}")) for k in
                           ("MEAN", "STANDARD_DEVIATION", "MEAN_STANDARD_ERROR"))
        for i, (m, s, e) in enumerate(zip(mean, sd, error, strict=True)):
            key = ours if ours == "mean_ability" else f"{ours}[{i}]"
            moments[key] = [float(m), float(s), float(e), float(m * m + s * s), float(4 * m * m * s * s + 2 * s**4)]
    return {"target": "irt", "sampler": "inference-gym's ground truth for SyntheticItemResponseTheory (Stan, 50,000 "
            "draws); E[x^2], Var[x^2] of a normal marginal", "moments": moments}


def make(name: str, gym_root: Path | None = None) -> dict:
    """The kept reference of ``name``: ``brownian``'s exact; ``irt``'s from an inference-gym source tree."""
    if name == "brownian":
        return brownian_exact()
    if name == "irt":
        if gym_root is None:
            raise SystemExit("irt: give --gym-root, the inference_gym folder of an inference-gym install")
        return import_gym_irt(gym_root)
    raise SystemExit(f"{name!r}: no reference to make (icg100's is exact, computed when asked)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", default=["brownian", "irt"])
    ap.add_argument("--gym-root", type=Path, default=None, help="irt: the inference_gym folder of an install")
    args = ap.parse_args(argv)
    REFERENCES.mkdir(exist_ok=True)
    for name in args.names:
        out = make(name, args.gym_root)
        (REFERENCES / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")
        print(f"{name}: {out['sampler']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
