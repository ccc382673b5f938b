"""Reference posteriors (posteriordb) as plain JAX log densities, for validating samplers.

Each :class:`ReferencePosterior` describes one of the six posteriors in
``tests/validation/reference_posteriors`` (see that folder's README.md):

* ``logdensity(position)``: the log density over an *unconstrained* position dict, including every
  log-Jacobian (Stan's transforms: ``x = exp(u)`` for ``x > 0``, ``x = sigmoid(u)`` for ``x in (0, 1)``,
  ordered pair ``x1 = u1, x2 = u1 + exp(u2)``). Pure ``jnp``; the result follows the dtype of the
  position (float32 by default, float64 under ``jax_enable_x64``). Normalising constants are kept, so the
  value is the exact log of the (unnormalised) posterior density, up to the log evidence.
* ``init``: one chain's starting point (numpy float64 arrays; cast to the working dtype as needed).
* ``to_reference(posterior, derived=False)``: maps draws of the position dict (leading dims
  ``(chain, draw)``) to Stan's constrained parameters, named as in ``reference_draws.json``
  (``theta[1]``, ``tau``, ...); ``derived=True`` adds the unconstrained / non-centred quantities that
  have reference moments too (``log_tau``, ``theta_trans[j]``, ``log_sigma``, ...).
  ``from_reference`` is its inverse (Stan names -> unconstrained position).
* ``dense_mass``: whether to adapt a dense metric (True only for kidiq, see below); ``x64``: whether to
  run in float64 (kidiq, sblrc, as the README advises); ``expect_unbiased``: False for the centred
  eight schools, where default NUTS/HMC is expected to diverge and bias log tau.
* ``numpyro_model`` / ``numpyro_to_reference`` / ``numpyro_unconstrained``: the same posterior written as a
  NumPyro user would (constrained priors, NumPyro adds the Jacobians), used as an independent
  cross-check of ``logdensity``.

Data are read lazily from ``tests/validation/reference_posteriors`` (kept in the repository; the big
``reference_draws.json`` files are stored gzipped as ``reference_draws.json.gz``), or from
``$DHMC_REFERENCE_POSTERIORS`` when set.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ENV_VAR = "DHMC_REFERENCE_POSTERIORS"
IN_REPO_ROOT = Path(__file__).resolve().parent / "reference_posteriors"
"""The copy of the reference posteriors kept in the repository (the default :func:`reference_root`)."""

Position = dict[str, Any]


# --------------------------------------------------------------------------------------------------
# Locating and loading the reference data
# --------------------------------------------------------------------------------------------------


def reference_root() -> Path:
    """Folder holding the reference posteriors: ``$DHMC_REFERENCE_POSTERIORS`` when set, else :data:`IN_REPO_ROOT`."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser().resolve()
    return IN_REPO_ROOT


def reference_available() -> bool:
    """True when the reference folder exists (always, in a clone, unless ``$DHMC_REFERENCE_POSTERIORS`` is wrong)."""
    return reference_root().is_dir()


def unavailable_reason() -> str:
    """Why :func:`reference_available` is False, and how to fix it (the tests' skip reason)."""
    root = reference_root()
    if os.environ.get(ENV_VAR):
        return (
            f"reference posteriors not found: ${ENV_VAR} is set to {root}, which is not a folder; "
            f"unset ${ENV_VAR} to use the copy in the repository ({IN_REPO_ROOT}), or point it at a "
            "folder laid out like that one"
        )
    return (
        f"reference posteriors not found: the folder {root} kept in the repository is missing; restore "
        "it from version control (git checkout -- tests/validation/reference_posteriors) or set "
        f"${ENV_VAR} to a folder laid out like it"
    )


def reference_file(name: str, filename: str) -> Path | None:
    """``<root>/<name>/<filename>``, or the same with ``.gz`` appended when only that exists; else None."""
    path = reference_root() / name / filename
    if path.is_file():
        return path
    gz = path.with_name(path.name + ".gz")
    return gz if gz.is_file() else None


@functools.cache
def _load_json_cached(path: str) -> Any:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def load_json(name: str, filename: str) -> Any:
    """Parsed ``<root>/<name>/<filename>``, read from ``<filename>.gz`` when only that exists (cached per path)."""
    path = reference_file(name, filename)
    if path is None:
        missing = reference_root() / name / filename
        raise FileNotFoundError(
            f"reference file {missing} (or {missing.name}.gz) not found; set ${ENV_VAR} to the folder holding "
            f"the reference posteriors, or unset it to use the copy in the repository ({IN_REPO_ROOT})"
        )
    return _load_json_cached(str(path))


def _data(name: str) -> dict[str, np.ndarray]:
    """The model's data.json as float64 numpy arrays (ints such as N are kept as Python ints)."""
    return _data_cached(str(reference_root()), name)


@functools.cache
def _data_cached(root: str, name: str) -> dict[str, Any]:
    raw = load_json(name, "data.json")
    out: dict[str, Any] = {}
    for k, v in raw.items():
        out[k] = np.asarray(v, dtype=np.float64) if isinstance(v, list) else v
    if name == "arK-arK":
        # Lagged design: row i is time t = K + i (0-based); column k-1 holds y[t - k], k = 1..K.
        y, K, T = out["y"], int(raw["K"]), int(raw["T"])
        out["ar_target"] = y[K:T]
        out["ar_lags"] = np.stack([y[K - k : T - k] for k in range(1, K + 1)], axis=1)
    for v in out.values():
        if isinstance(v, np.ndarray):
            v.setflags(write=False)
    return out


def reference_draws(name: str) -> dict[str, np.ndarray]:
    """The reference draws as ``{stan_name: array (chain, draw)}`` (10 x 1000, constrained space)."""
    chains = load_json(name, "reference_draws.json")
    keys = list(chains[0])
    return {k: np.asarray([c[k] for c in chains], dtype=np.float64) for k in keys}


def stan_parameter_names(name: str) -> list[str]:
    """Stan's parameter names in the order of ``reference_draws.json``."""
    return list(load_json(name, "summary.json")["parameter_names"])


def reference_moments(name: str, *, derived: bool = True) -> dict[str, tuple[float, float, float]]:
    """Targets ``{name: (mean, sd, mcse_ref)}`` for the comparison.

    Exact moments (closed form / quadrature, ``exact_moments.json``) are used where they exist, with
    ``mcse_ref = 0``; otherwise the reference draws' mean and sd (as recorded in ``summary.json``, which
    matches the draws to 1e-14) and ``mcse_mean`` from the summary (sd / sqrt(posteriordb bulk-ESS)).
    With ``derived=True`` the unconstrained / non-centred quantities of ``summary.json["derived"]`` and
    ``exact_moments.json`` (``log_tau``, ``theta_trans[j]``, ``log_sigma`` ...) are included as well; they
    are only compared when a sampler's draws contain them (``to_reference(..., derived=True)``).
    """
    summary = load_json(name, "summary.json")
    has_exact = reference_file(name, "exact_moments.json") is not None
    exact = load_json(name, "exact_moments.json")["moments"] if has_exact else {}
    out: dict[str, tuple[float, float, float]] = {}
    sections = [summary["parameters"]] + ([summary.get("derived", {})] if derived else [])
    for section in sections:
        for key, s in section.items():
            if key in exact:
                out[key] = (float(exact[key]["mean"]), float(exact[key]["sd"]), 0.0)
            else:
                out[key] = (float(s["mean"]), float(s["sd"]), float(s["mcse_mean"]))
    if derived:
        for key, e in exact.items():
            if key not in out and isinstance(e, dict) and "mean" in e and "sd" in e:
                out[key] = (float(e["mean"]), float(e["sd"]), 0.0)
    return out


# --------------------------------------------------------------------------------------------------
# Small dtype-following log-density pieces
# --------------------------------------------------------------------------------------------------

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)
_LOG_2_OVER_PI = math.log(2.0 / math.pi)


def _dtype(position: Mapping[str, Any]) -> Any:
    """Floating dtype of the position (result type of its leaves; the default float otherwise)."""
    dt = jnp.result_type(*jax.tree_util.tree_leaves(position))
    if not jnp.issubdtype(dt, jnp.floating):
        dt = jnp.result_type(float)
    return dt


def _arr(x: np.ndarray, dtype: Any) -> jax.Array:
    return jnp.asarray(x, dtype=dtype)


def _normal_lpdf(x, loc, scale):
    """log N(x | loc, scale) with a constant (Python float or data array) scale."""
    z = (x - loc) / scale
    return -0.5 * z * z - jnp.log(scale) - _HALF_LOG_2PI


def _normal_lpdf_logscale(x, loc, log_scale):
    """log N(x | loc, exp(log_scale)) written in terms of log_scale (no log(exp(.)) round trip)."""
    z = (x - loc) * jnp.exp(-log_scale)
    return -0.5 * z * z - log_scale - _HALF_LOG_2PI


def _halfcauchy_lpdf_logx(log_x, scale: float):
    """log HalfCauchy(x | scale) = log(2/pi) - log(scale) - log1p((x/scale)^2), in terms of log x."""
    return _LOG_2_OVER_PI - math.log(scale) - jnp.logaddexp(0.0, 2.0 * (log_x - math.log(scale)))


def _halfnormal_lpdf_logx(log_x, scale: float):
    """log HalfNormal(x | scale) = log 2 + log N(x | 0, scale), in terms of log x."""
    z = jnp.exp(log_x) / scale
    return _LOG_2 - 0.5 * z * z - math.log(scale) - _HALF_LOG_2PI


def _stack_named(base: str, x: np.ndarray) -> dict[str, np.ndarray]:
    """Split the last axis of x into Stan names base[1], base[2], ..."""
    return {f"{base}[{j + 1}]": np.asarray(x[..., j]) for j in range(x.shape[-1])}


# --------------------------------------------------------------------------------------------------
# The posterior description
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ReferencePosterior:
    """One reference posterior: unconstrained JAX log density plus maps to Stan's reported parameters."""

    name: str
    logdensity: Callable[[Position], jax.Array]
    init: dict[str, np.ndarray] = field(repr=False)
    dense_mass: bool
    x64: bool
    to_reference: Callable[..., dict[str, np.ndarray]] = field(repr=False)
    # Inverse of to_reference: {stan_name: constrained array} -> unconstrained position (numpy).
    from_reference: Callable[[Mapping[str, Any]], dict[str, np.ndarray]] = field(repr=False)
    numpyro_model: Callable[[], None] | None = field(default=None, repr=False)
    numpyro_to_reference: Callable[..., dict[str, np.ndarray]] | None = field(default=None, repr=False)
    # Maps a logdensity position to the NumPyro model's unconstrained sites (for potential_energy).
    numpyro_unconstrained: Callable[[Position], dict[str, Any]] | None = field(default=None, repr=False)
    difficulty: str = ""
    # Reference moments for this posterior are only a fair target for a well-behaved sampler (False for
    # the centred eight schools, where plain NUTS/HMC under-explores small tau: see README).
    expect_unbiased: bool = True
    notes: str = field(default="", repr=False)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(np.shape(v)) for k, v in self.init.items()}

    @property
    def dim(self) -> int:
        return int(sum(int(np.prod(s)) for s in self.shapes.values()))

    @property
    def folder(self) -> Path:
        return reference_root() / self.name

    def parameter_names(self) -> list[str]:
        return stan_parameter_names(self.name)

    def moments(self, *, derived: bool = True) -> dict[str, tuple[float, float, float]]:
        return reference_moments(self.name, derived=derived)

    def init_as(self, dtype: Any = None) -> dict[str, jax.Array]:
        """``init`` as JAX arrays of ``dtype`` (default: the default float dtype)."""
        dtype = jnp.result_type(float) if dtype is None else dtype
        return {k: jnp.asarray(v, dtype=dtype) for k, v in self.init.items()}


def _np(posterior: Mapping[str, Any], key: str) -> np.ndarray:
    return np.asarray(posterior[key], dtype=np.float64)


# ---- 1. eight_schools-eight_schools_noncentered -------------------------------------------------

_ES_NC = "eight_schools-eight_schools_noncentered"
_ES_C = "eight_schools-eight_schools_centered"


def _eight_schools_noncentered_logdensity(position: Position) -> jax.Array:
    dt = _dtype(position)
    d = _data(_ES_NC)
    y, sigma = _arr(d["y"], dt), _arr(d["sigma"], dt)
    theta_trans, mu, log_tau = position["theta_trans"], position["mu"], position["log_tau"]
    theta = mu + jnp.exp(log_tau) * theta_trans
    return (
        jnp.sum(_normal_lpdf(theta_trans, 0.0, 1.0))
        + jnp.sum(_normal_lpdf(y, theta, sigma))
        + _normal_lpdf(mu, 0.0, 5.0)
        + _halfcauchy_lpdf_logx(log_tau, 5.0)
        + log_tau  # Jacobian of tau = exp(log_tau)
    )


def _eight_schools_noncentered_to_reference(posterior: Mapping[str, Any], derived: bool = False):
    tt, mu, log_tau = _np(posterior, "theta_trans"), _np(posterior, "mu"), _np(posterior, "log_tau")
    tau = np.exp(log_tau)
    out = _stack_named("theta", mu[..., None] + tau[..., None] * tt)
    out.update(mu=mu, tau=tau)
    if derived:
        out.update(_stack_named("theta_trans", tt))
        out["log_tau"] = log_tau
    return out


def _unstack_named(base: str, ref: Mapping[str, Any]) -> np.ndarray:
    """Inverse of _stack_named: gather base[1], base[2], ... into the last axis."""
    n = sum(1 for k in ref if k.startswith(base + "["))
    return np.stack([np.asarray(ref[f"{base}[{j + 1}]"], dtype=np.float64) for j in range(n)], axis=-1)


def _eight_schools_noncentered_from_reference(ref: Mapping[str, Any]) -> dict[str, np.ndarray]:
    theta, mu, tau = _unstack_named("theta", ref), _np(ref, "mu"), _np(ref, "tau")
    return {"theta_trans": (theta - mu[..., None]) / tau[..., None], "mu": mu, "log_tau": np.log(tau)}


def _eight_schools_noncentered_numpyro():
    import numpyro
    import numpyro.distributions as dist

    d = _data(_ES_NC)
    y, sigma = jnp.asarray(d["y"]), jnp.asarray(d["sigma"])
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("J", y.shape[0]):
        theta_trans = numpyro.sample("theta_trans", dist.Normal(0.0, 1.0))
        theta = numpyro.deterministic("theta", mu + tau * theta_trans)
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def _eight_schools_numpyro_to_reference(samples: Mapping[str, Any], derived: bool = False):
    theta, mu, tau = _np(samples, "theta"), _np(samples, "mu"), _np(samples, "tau")
    out = _stack_named("theta", theta)
    out.update(mu=mu, tau=tau)
    if derived:
        out.update(_stack_named("theta_trans", (theta - mu[..., None]) / tau[..., None]))
        out["log_tau"] = np.log(tau)
    return out


# ---- 2. eight_schools-eight_schools_centered ----------------------------------------------------


def _eight_schools_centered_logdensity(position: Position) -> jax.Array:
    dt = _dtype(position)
    d = _data(_ES_C)
    y, sigma = _arr(d["y"], dt), _arr(d["sigma"], dt)
    theta, mu, log_tau = position["theta"], position["mu"], position["log_tau"]
    return (
        _normal_lpdf(mu, 0.0, 5.0)
        + _halfcauchy_lpdf_logx(log_tau, 5.0)
        + jnp.sum(_normal_lpdf_logscale(theta, mu, log_tau))  # keeps the -8 log tau
        + jnp.sum(_normal_lpdf(y, theta, sigma))
        + log_tau  # Jacobian of tau = exp(log_tau)
    )


def _eight_schools_centered_to_reference(posterior: Mapping[str, Any], derived: bool = False):
    theta, mu, log_tau = _np(posterior, "theta"), _np(posterior, "mu"), _np(posterior, "log_tau")
    tau = np.exp(log_tau)
    out = _stack_named("theta", theta)
    out.update(mu=mu, tau=tau)
    if derived:
        out.update(_stack_named("theta_trans", (theta - mu[..., None]) / tau[..., None]))
        out["log_tau"] = log_tau
    return out


def _eight_schools_centered_from_reference(ref: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {"theta": _unstack_named("theta", ref), "mu": _np(ref, "mu"), "log_tau": np.log(_np(ref, "tau"))}


def _eight_schools_centered_numpyro():
    import numpyro
    import numpyro.distributions as dist

    d = _data(_ES_C)
    y, sigma = jnp.asarray(d["y"]), jnp.asarray(d["sigma"])
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("J", y.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


# ---- 3. kidiq-kidscore_momiq --------------------------------------------------------------------

_KIDIQ = "kidiq-kidscore_momiq"


def _kidiq_logdensity(position: Position) -> jax.Array:
    dt = _dtype(position)
    d = _data(_KIDIQ)
    kid_score, mom_iq = _arr(d["kid_score"], dt), _arr(d["mom_iq"], dt)
    beta, log_sigma = position["beta"], position["log_sigma"]
    # beta: flat prior (no term).
    return (
        jnp.sum(_normal_lpdf_logscale(kid_score, beta[0] + beta[1] * mom_iq, log_sigma))
        + _halfcauchy_lpdf_logx(log_sigma, 2.5)
        + log_sigma  # Jacobian of sigma = exp(log_sigma)
    )


def _regression_to_reference(posterior: Mapping[str, Any], derived: bool = False):
    log_sigma = _np(posterior, "log_sigma")
    out = {}
    if "alpha" in posterior:
        out["alpha"] = _np(posterior, "alpha")
    out.update(_stack_named("beta", _np(posterior, "beta")))
    out["sigma"] = np.exp(log_sigma)
    if derived:
        out["log_sigma"] = log_sigma
    return out


def _regression_from_reference(ref: Mapping[str, Any]) -> dict[str, np.ndarray]:
    out = {"alpha": _np(ref, "alpha")} if "alpha" in ref else {}
    out["beta"] = _unstack_named("beta", ref)
    out["log_sigma"] = np.log(_np(ref, "sigma"))
    return out


def _regression_numpyro_to_reference(samples: Mapping[str, Any], derived: bool = False):
    sigma = _np(samples, "sigma")
    out = {}
    if "alpha" in samples:
        out["alpha"] = _np(samples, "alpha")
    out.update(_stack_named("beta", _np(samples, "beta")))
    out["sigma"] = sigma
    if derived:
        out["log_sigma"] = np.log(sigma)
    return out


def _kidiq_numpyro():
    import numpyro
    import numpyro.distributions as dist
    from numpyro.distributions import constraints

    d = _data(_KIDIQ)
    kid_score, mom_iq = jnp.asarray(d["kid_score"]), jnp.asarray(d["mom_iq"])
    # Flat (improper) prior on beta, as in the Stan model.
    beta = numpyro.sample("beta", dist.ImproperUniform(constraints.real_vector, (), event_shape=(2,)))
    sigma = numpyro.sample("sigma", dist.HalfCauchy(2.5))
    with numpyro.plate("N", kid_score.shape[0]):
        numpyro.sample("kid_score", dist.Normal(beta[0] + beta[1] * mom_iq, sigma), obs=kid_score)


def _regression_numpyro_unconstrained(position: Position) -> dict[str, Any]:
    out = {k: v for k, v in position.items() if k != "log_sigma"}
    out["sigma"] = position["log_sigma"]
    return out


# ---- 4. sblrc-blr -------------------------------------------------------------------------------

_SBLRC = "sblrc-blr"


def _sblrc_logdensity(position: Position) -> jax.Array:
    dt = _dtype(position)
    d = _data(_SBLRC)
    X, y = _arr(d["X"], dt), _arr(d["y"], dt)
    beta, log_sigma = position["beta"], position["log_sigma"]
    return (
        jnp.sum(_normal_lpdf(beta, 0.0, 10.0))
        + _halfnormal_lpdf_logx(log_sigma, 10.0)
        + jnp.sum(_normal_lpdf_logscale(y, X @ beta, log_sigma))
        + log_sigma  # Jacobian of sigma = exp(log_sigma)
    )


def _sblrc_numpyro():
    import numpyro
    import numpyro.distributions as dist

    d = _data(_SBLRC)
    X, y = jnp.asarray(d["X"]), jnp.asarray(d["y"])
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(10.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(X @ beta, sigma), obs=y)


# ---- 6. arK-arK ---------------------------------------------------------------------------------

_ARK = "arK-arK"


def _ark_logdensity(position: Position) -> jax.Array:
    dt = _dtype(position)
    d = _data(_ARK)
    target, lags = _arr(d["ar_target"], dt), _arr(d["ar_lags"], dt)
    alpha, beta, log_sigma = position["alpha"], position["beta"], position["log_sigma"]
    return (
        _normal_lpdf(alpha, 0.0, 10.0)
        + jnp.sum(_normal_lpdf(beta, 0.0, 10.0))
        + _halfcauchy_lpdf_logx(log_sigma, 2.5)
        + jnp.sum(_normal_lpdf_logscale(target, alpha + lags @ beta, log_sigma))  # t = K+1..T
        + log_sigma  # Jacobian of sigma = exp(log_sigma)
    )


def _ark_numpyro():
    import numpyro
    import numpyro.distributions as dist

    d = _data(_ARK)
    target, lags = jnp.asarray(d["ar_target"]), jnp.asarray(d["ar_lags"])
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 10.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([lags.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfCauchy(2.5))
    with numpyro.plate("T", target.shape[0]):
        numpyro.sample("y", dist.Normal(alpha + lags @ beta, sigma), obs=target)


# ---- 8. low_dim_gauss_mix-low_dim_gauss_mix -----------------------------------------------------

_GMIX = "low_dim_gauss_mix-low_dim_gauss_mix"
_LOG_BETA_5_5 = math.lgamma(5.0) + math.lgamma(5.0) - math.lgamma(10.0)  # log B(5, 5) = -log 630


def _gauss_mix_logdensity(position: Position) -> jax.Array:
    dt = _dtype(position)
    y = _arr(_data(_GMIX)["y"], dt)
    mu1, log_gap = position["mu1"], position["log_mu_gap"]
    log_sigma, logit_theta = position["log_sigma"], position["logit_theta"]
    mu2 = mu1 + jnp.exp(log_gap)
    log_theta = jax.nn.log_sigmoid(logit_theta)
    log1m_theta = jax.nn.log_sigmoid(-logit_theta)
    comp1 = log_theta + _normal_lpdf_logscale(y, mu1, log_sigma[0])
    comp2 = log1m_theta + _normal_lpdf_logscale(y, mu2, log_sigma[1])
    return (
        jnp.sum(_halfnormal_lpdf_logx(log_sigma, 2.0))
        + _normal_lpdf(mu1, 0.0, 2.0)
        + _normal_lpdf(mu2, 0.0, 2.0)
        + (4.0 * log_theta + 4.0 * log1m_theta - _LOG_BETA_5_5)  # Beta(5, 5)
        + jnp.sum(jnp.logaddexp(comp1, comp2))  # log-sum-exp of the two components
        + log_gap  # Jacobian of the ordered transform
        + jnp.sum(log_sigma)  # Jacobian of sigma = exp(log_sigma)
        + log_theta
        + log1m_theta  # Jacobian of theta = sigmoid(logit_theta)
    )


def _gauss_mix_to_reference(posterior: Mapping[str, Any], derived: bool = False):
    mu1, log_gap = _np(posterior, "mu1"), _np(posterior, "log_mu_gap")
    log_sigma, logit_theta = _np(posterior, "log_sigma"), _np(posterior, "logit_theta")
    out = {"mu[1]": mu1, "mu[2]": mu1 + np.exp(log_gap)}
    out.update(_stack_named("sigma", np.exp(log_sigma)))
    out["theta"] = 1.0 / (1.0 + np.exp(-logit_theta))
    if derived:
        out["log_mu_gap"] = log_gap
        out.update(_stack_named("log_sigma", log_sigma))
        out["logit_theta"] = logit_theta
    return out


def _gauss_mix_from_reference(ref: Mapping[str, Any]) -> dict[str, np.ndarray]:
    mu1, mu2, theta = _np(ref, "mu[1]"), _np(ref, "mu[2]"), _np(ref, "theta")
    return {
        "mu1": mu1,
        "log_mu_gap": np.log(mu2 - mu1),
        "log_sigma": np.log(_unstack_named("sigma", ref)),
        "logit_theta": np.log(theta) - np.log1p(-theta),
    }


def _gauss_mix_numpyro():
    import numpyro
    import numpyro.distributions as dist
    from numpyro.distributions import constraints

    y = jnp.asarray(_data(_GMIX)["y"])
    # Ordered means with independent N(0, 2) priors, as in Stan's `ordered[2] mu; mu ~ normal(0, 2)`.
    mu = numpyro.sample("mu", dist.ImproperUniform(constraints.ordered_vector, (), event_shape=(2,)))
    numpyro.factor("mu_prior", jnp.sum(dist.Normal(0.0, 2.0).log_prob(mu)))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0).expand([2]).to_event(1))
    theta = numpyro.sample("theta", dist.Beta(5.0, 5.0))
    mixing = dist.Categorical(probs=jnp.stack([theta, 1.0 - theta]))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.MixtureSameFamily(mixing, dist.Normal(mu, sigma)), obs=y)


def _gauss_mix_numpyro_to_reference(samples: Mapping[str, Any], derived: bool = False):
    mu, sigma, theta = _np(samples, "mu"), _np(samples, "sigma"), _np(samples, "theta")
    out = _stack_named("mu", mu)
    out.update(_stack_named("sigma", sigma))
    out["theta"] = theta
    if derived:
        out["log_mu_gap"] = np.log(mu[..., 1] - mu[..., 0])
        out.update(_stack_named("log_sigma", np.log(sigma)))
        out["logit_theta"] = np.log(theta) - np.log1p(-theta)
    return out


def _gauss_mix_numpyro_unconstrained(position: Position) -> dict[str, Any]:
    return {
        "mu": jnp.stack([position["mu1"], position["log_mu_gap"]], axis=-1),
        "sigma": position["log_sigma"],
        "theta": position["logit_theta"],
    }


# --------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------


def _zeros(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=np.float64)


def _full(value: float, *shape: int) -> np.ndarray:
    return np.full(shape, value, dtype=np.float64)


EIGHT_SCHOOLS_NONCENTERED = ReferencePosterior(
    name=_ES_NC,
    logdensity=_eight_schools_noncentered_logdensity,
    init={"theta_trans": _zeros(8), "mu": _zeros(), "log_tau": _zeros()},
    dense_mass=False,
    x64=False,
    to_reference=_eight_schools_noncentered_to_reference,
    from_reference=_eight_schools_noncentered_from_reference,
    numpyro_model=_eight_schools_noncentered_numpyro,
    numpyro_to_reference=_eight_schools_numpyro_to_reference,
    numpyro_unconstrained=lambda p: {"theta_trans": p["theta_trans"], "mu": p["mu"], "tau": p["log_tau"]},
    difficulty="easy",
)

EIGHT_SCHOOLS_CENTERED = ReferencePosterior(
    name=_ES_C,
    logdensity=_eight_schools_centered_logdensity,
    init={"theta": _zeros(8), "mu": _zeros(), "log_tau": _zeros()},
    dense_mass=False,
    x64=False,
    to_reference=_eight_schools_centered_to_reference,
    from_reference=_eight_schools_centered_from_reference,
    numpyro_model=_eight_schools_centered_numpyro,
    numpyro_to_reference=_eight_schools_numpyro_to_reference,
    numpyro_unconstrained=lambda p: {"theta": p["theta"], "mu": p["mu"], "tau": p["log_tau"]},
    difficulty="hard: funnel, divergences expected",
    expect_unbiased=False,
    notes="Uses the non-centred reference draws (same distribution over theta, mu, tau). Plain NUTS/HMC "
    "diverges in the neck of the funnel and biases log tau upward; a test of divergence reporting.",
)

KIDIQ = ReferencePosterior(
    name=_KIDIQ,
    logdensity=_kidiq_logdensity,
    # Intercept-only fit (mean and log sd of kid_score): a crude, data-scaled start, far from the mode
    # in the correlated (beta[1], beta[2]) direction. All-zeros is finite too but ~1e6 nats down.
    init={"beta": np.array([87.0, 0.0]), "log_sigma": _full(3.0)},
    # Diagonal adaptation cannot remove corr(beta1, beta2) = -0.989 (cond(corr) = 187): with a diagonal
    # metric NUTS needs ~5x more leapfrog steps per draw (BlackJAX: ~24 vs ~5) and a fixed-length HMC
    # would need ~sqrt(187) ~ 14x longer trajectories. A diagonal metric does still work (Stan's
    # reference used one), so this is a choice, not a necessity: a dense metric is cheap in d = 3, makes
    # the target nearly isotropic, and makes this the posterior that exercises dense_mass=True.
    dense_mass=True,
    x64=True,
    to_reference=_regression_to_reference,
    from_reference=_regression_from_reference,
    numpyro_model=_kidiq_numpyro,
    numpyro_to_reference=_regression_numpyro_to_reference,
    numpyro_unconstrained=_regression_numpyro_unconstrained,
    difficulty="easy, strongly correlated",
)

SBLRC = ReferencePosterior(
    name=_SBLRC,
    logdensity=_sblrc_logdensity,
    # beta = 0 and sigma = sd(y) ~ 111 (the best sigma for beta = 0).
    init={"beta": _zeros(5), "log_sigma": _full(4.7)},
    dense_mass=False,
    x64=True,
    to_reference=_regression_to_reference,
    from_reference=_regression_from_reference,
    numpyro_model=_sblrc_numpyro,
    numpyro_to_reference=_regression_numpyro_to_reference,
    numpyro_unconstrained=_regression_numpyro_unconstrained,
    difficulty="easy/medium, correlated, badly scaled",
)

ARK = ReferencePosterior(
    name=_ARK,
    logdensity=_ark_logdensity,
    init={"alpha": _zeros(), "beta": _zeros(5), "log_sigma": _zeros()},
    # cond(corr) = 120, so a dense metric helps a lot here too (BlackJAX NUTS: ~6 vs ~33 leapfrog steps
    # per draw), but the diagonal metric works (Stan's reference used diag_e); kept diagonal so that the
    # validation covers diagonal adaptation on a correlated target.
    dense_mass=False,
    x64=False,
    to_reference=_regression_to_reference,
    from_reference=_regression_from_reference,
    numpyro_model=_ark_numpyro,
    numpyro_to_reference=_regression_numpyro_to_reference,
    numpyro_unconstrained=_regression_numpyro_unconstrained,
    difficulty="medium",
)

LOW_DIM_GAUSS_MIX = ReferencePosterior(
    name=_GMIX,
    logdensity=_gauss_mix_logdensity,
    # mu = (0, 1), sigma = (1, 1), theta = 0.5.
    init={"mu1": _zeros(), "log_mu_gap": _zeros(), "log_sigma": _zeros(2), "logit_theta": _zeros()},
    dense_mass=False,
    x64=False,
    to_reference=_gauss_mix_to_reference,
    from_reference=_gauss_mix_from_reference,
    numpyro_model=_gauss_mix_numpyro,
    numpyro_to_reference=_gauss_mix_numpyro_to_reference,
    numpyro_unconstrained=_gauss_mix_numpyro_unconstrained,
    difficulty="easy/medium: mixture with ordered means",
)

REFERENCE_POSTERIORS: dict[str, ReferencePosterior] = {
    p.name: p
    for p in (
        EIGHT_SCHOOLS_NONCENTERED,
        EIGHT_SCHOOLS_CENTERED,
        KIDIQ,
        SBLRC,
        ARK,
        LOW_DIM_GAUSS_MIX,
    )
}


def get(name: str) -> ReferencePosterior:
    """Look up a posterior by folder name (or an unambiguous prefix such as ``"kidiq"``)."""
    if name in REFERENCE_POSTERIORS:
        return REFERENCE_POSTERIORS[name]
    hits = [k for k in REFERENCE_POSTERIORS if k.startswith(name)]
    if len(hits) != 1:
        raise KeyError(f"unknown or ambiguous posterior {name!r}; known: {sorted(REFERENCE_POSTERIORS)}")
    return REFERENCE_POSTERIORS[hits[0]]
