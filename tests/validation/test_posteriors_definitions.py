"""Fast checks of the reference-posterior definitions (no sampling).

Shapes, finiteness of the log density and its gradient at ``init`` (float32 and float64), dtype
following, ``to_reference``/``from_reference`` round trips, agreement of the JAX log density with the
NumPyro model's potential energy (they agree exactly: both keep all normalising constants), and the
behaviour of ``compare`` on the reference draws themselves.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.validation import posteriors
from tests.validation.compare import assert_matches_reference, compare
from tests.validation.posteriors import (
    ENV_VAR,
    REFERENCE_POSTERIORS,
    get,
    reference_available,
    reference_draws,
    reference_moments,
    stan_parameter_names,
    unavailable_reason,
)

pytestmark = pytest.mark.skipif(not reference_available(), reason=unavailable_reason())

POSTERIORS = list(REFERENCE_POSTERIORS.values())
IDS = [p.name.split("-")[0] + ("_c" if p.name.endswith("_centered") else "") for p in POSTERIORS]
WITH_NUMPYRO = [p for p in POSTERIORS if p.numpyro_model is not None]
NUMPYRO_IDS = [i for p, i in zip(POSTERIORS, IDS, strict=True) if p.numpyro_model is not None]


def _finite(tree) -> bool:
    return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(tree))


def _points(post, n: int = 4, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """init, jittered inits and a few reference draws, in unconstrained space."""
    rng = np.random.default_rng(seed)
    pts = [dict(post.init)]
    pts += [{k: v + rng.normal(scale=0.3, size=np.shape(v)) for k, v in post.init.items()} for _ in range(n)]
    ref = post.from_reference(reference_draws(post.name))
    pts += [{k: v[c, d] for k, v in ref.items()} for c, d in [(0, 0), (5, 123), (9, 999)]]
    return pts


def test_registry():
    assert len(REFERENCE_POSTERIORS) == 6
    assert {p.name for p in POSTERIORS} == {
        "eight_schools-eight_schools_noncentered",
        "eight_schools-eight_schools_centered",
        "kidiq-kidscore_momiq",
        "sblrc-blr",
        "arK-arK",
        "low_dim_gauss_mix-low_dim_gauss_mix",
    }
    for p in POSTERIORS:
        assert p.folder.is_dir(), p.folder
    assert get("kidiq") is REFERENCE_POSTERIORS["kidiq-kidscore_momiq"]
    assert REFERENCE_POSTERIORS["kidiq-kidscore_momiq"].dense_mass
    assert {p.name for p in POSTERIORS if p.x64} == {"kidiq-kidscore_momiq", "sblrc-blr"}
    assert {"eight_schools-eight_schools_noncentered", "kidiq-kidscore_momiq"} <= {p.name for p in WITH_NUMPYRO}


@pytest.mark.parametrize("post", POSTERIORS, ids=IDS)
def test_shapes_and_reference_names(post):
    expected_dim = {"kidiq": 3, "sblrc": 6, "arK": 7, "low_dim_gauss_mix": 5}.get(post.name.split("-")[0], 10)
    assert post.dim == expected_dim
    batched = {k: np.broadcast_to(v, (2, 3) + np.shape(v)) for k, v in post.init.items()}
    ref = post.to_reference(batched)
    assert list(ref) == stan_parameter_names(post.name)
    for k, v in ref.items():
        assert v.shape == (2, 3), k
        assert np.all(np.isfinite(v)), k
    assert set(post.to_reference(batched, derived=True)) >= set(ref)


@pytest.mark.parametrize("x64", [False, True], ids=["f32", "f64"])
@pytest.mark.slow  # traces and compiles each posterior (~1 s each): for the slow validation and the benchmarks
@pytest.mark.parametrize("post", POSTERIORS, ids=IDS)
def test_logdensity_and_gradient_finite_at_init(post, x64):
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        pos = post.init_as(dtype)
        lp = post.logdensity(pos)
        assert lp.shape == () and lp.dtype == dtype
        assert bool(jnp.isfinite(lp))
        lp_jit, grad = jax.jit(jax.value_and_grad(post.logdensity))(pos)
        assert math.isclose(float(lp_jit), float(lp), rel_tol=1e-5 if not x64 else 1e-12)
        assert jax.tree_util.tree_structure(grad) == jax.tree_util.tree_structure(pos)
        for k in pos:
            assert grad[k].shape == pos[k].shape and grad[k].dtype == dtype, k
        assert _finite(grad)


@pytest.mark.slow  # traces and compiles each posterior (~1 s each): for the slow validation and the benchmarks
@pytest.mark.parametrize("post", POSTERIORS, ids=IDS)
def test_logdensity_follows_dtype_and_vmaps(post):
    with jax.enable_x64(True):
        lp32 = post.logdensity(post.init_as(jnp.float32))
        lp64 = post.logdensity(post.init_as(jnp.float64))
        assert lp32.dtype == jnp.float32 and lp64.dtype == jnp.float64
        assert math.isclose(float(lp32), float(lp64), rel_tol=1e-5)
    batch = {k: jnp.stack([jnp.asarray(p[k], jnp.float32) for p in _points(post, n=2)]) for k in post.init}
    lps = jax.vmap(post.logdensity)(batch)
    assert lps.shape == (len(_points(post, n=2)),) and _finite(lps)


@pytest.mark.parametrize("post", POSTERIORS, ids=IDS)
def test_reference_round_trip(post):
    draws = reference_draws(post.name)
    sub = {k: v[:2, :50] for k, v in draws.items()}
    back = post.to_reference(post.from_reference(sub))
    assert list(back) == list(sub)
    for k in sub:
        np.testing.assert_allclose(back[k], sub[k], rtol=1e-10, atol=1e-12, err_msg=k)


@pytest.mark.slow  # traces and compiles each posterior (~1 s each): for the slow validation and the benchmarks
@pytest.mark.parametrize("post", WITH_NUMPYRO, ids=NUMPYRO_IDS)
def test_logdensity_matches_numpyro_potential(post):
    """logdensity(x) + potential_energy(numpyro_model, x) is constant (in fact 0) over points."""
    from numpyro.infer.util import potential_energy

    def both(p):
        pe_fn = lambda q: potential_energy(post.numpyro_model, (), {}, post.numpyro_unconstrained(q))  # noqa: E731
        lp, g_lp = jax.value_and_grad(post.logdensity)(p)
        pe, g_pe = jax.value_and_grad(pe_fn)(p)
        return lp, pe, g_lp, g_pe

    points = _points(post)
    with jax.enable_x64(True):
        batch = {k: jnp.asarray(np.stack([p[k] for p in points]), jnp.float64) for k in post.init}
        lp, pe, g_lp, g_pe = jax.jit(jax.vmap(both))(batch)
        lp, pe = np.asarray(lp), np.asarray(pe)
        g_lp = {k: np.asarray(v) for k, v in g_lp.items()}
        g_pe = {k: np.asarray(v) for k, v in g_pe.items()}
    assert np.all(np.isfinite(lp)) and np.all(np.isfinite(pe))
    sums = lp + pe
    assert sums.max() - sums.min() < 1e-10 * max(1.0, np.abs(lp).max()), sums
    for k in post.init:
        scale = max(1.0, np.abs(g_lp[k]).max())
        np.testing.assert_allclose(g_lp[k], -g_pe[k], rtol=0, atol=1e-10 * scale, err_msg=k)


@pytest.mark.slow  # traces and compiles each posterior (~1 s each): for the slow validation and the benchmarks
@pytest.mark.parametrize("post", WITH_NUMPYRO, ids=NUMPYRO_IDS)
def test_numpyro_to_reference_names(post):
    from numpyro.infer.util import constrain_fn

    with jax.enable_x64(True):
        unconstrained = post.numpyro_unconstrained(post.init_as(jnp.float64))
        params = constrain_fn(post.numpyro_model, (), {}, unconstrained, return_deterministic=True)
        samples = {k: np.broadcast_to(np.asarray(v), (2, 3) + jnp.shape(v)) for k, v in params.items()}
    ref = post.numpyro_to_reference(samples)
    assert list(ref) == stan_parameter_names(post.name)
    direct = post.to_reference({k: np.broadcast_to(v, (2, 3) + np.shape(v)) for k, v in post.init.items()})
    for k in ref:
        np.testing.assert_allclose(ref[k], direct[k], rtol=1e-10, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("post", POSTERIORS, ids=IDS)
def test_reference_moments(post):
    moments = reference_moments(post.name)
    draws = reference_draws(post.name)
    for k in stan_parameter_names(post.name):
        mean, sd, mcse = moments[k]
        assert sd > 0 and mcse >= 0
        # Targets (exact where available) agree with the reference draws within their Monte Carlo error.
        assert abs(draws[k].mean() - mean) < 4 * draws[k].std() / math.sqrt(2000), k
        assert abs(draws[k].std() / sd - 1) < 0.05, k


@pytest.mark.parametrize("post", POSTERIORS, ids=IDS)
def test_compare_passes_on_reference_draws(post):
    draws = reference_draws(post.name)
    report = assert_matches_reference(draws, post.name)
    assert report.n_chains == 10 and report.n_draws == 1000
    assert report.max_abs_z < 3


def test_compare_detects_errors():
    name = "eight_schools-eight_schools_noncentered"
    draws = reference_draws(name)
    shifted = dict(draws, mu=draws["mu"] + 0.3 * draws["mu"].std())
    report = compare(shifted, name)
    assert not report.passed and [p.name for p in report.failures] == ["mu"]
    assert "FAIL" in str(report) and "mu" in str(report)
    widened = dict(draws, tau=draws["tau"].mean() + 1.2 * (draws["tau"] - draws["tau"].mean()))
    bad = compare(widened, name).failures
    assert [p.name for p in bad] == ["tau"] and bad[0].z_ok and not bad[0].sd_ok
    missing = {k: v for k, v in draws.items() if k != "theta[3]"}
    report = compare(missing, name)
    assert not report.passed and report.missing == ("theta[3]",)
    nonfinite = dict(draws, mu=np.where(np.arange(1000) == 7, np.nan, draws["mu"]))
    assert compare(nonfinite, name).nonfinite == ("mu",)
    # derived quantities are compared when present; unknown keys are ignored
    post = REFERENCE_POSTERIORS[name]
    extra = dict(draws, log_tau=np.log(draws["tau"]), lp__=np.zeros_like(draws["tau"]))
    report = compare(extra, name)
    assert report.passed and "log_tau" in [p.name for p in report.params] and report.ignored == ("lp__",)
    assert post.expect_unbiased and not REFERENCE_POSTERIORS["eight_schools-eight_schools_centered"].expect_unbiased


def test_env_var_override(monkeypatch, tmp_path):
    real = posteriors.reference_root()
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert posteriors.reference_root() == tmp_path.resolve()
    assert not (tmp_path / "kidiq-kidscore_momiq").exists()
    with pytest.raises(FileNotFoundError, match=ENV_VAR):
        reference_moments("kidiq-kidscore_momiq")
    monkeypatch.setenv(ENV_VAR, str(real))
    assert posteriors.reference_root() == real
    assert "beta[1]" in reference_moments("kidiq-kidscore_momiq")


FILES = [
    "data.json",
    "data_info.json",
    "model_info.json",
    "posterior.json",
    "reference_posterior_info.json",
    "summary.json",
    "reference_draws.json",
]


def test_default_root_is_the_copy_in_the_repository(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    root = posteriors.reference_root()
    here = Path(posteriors.__file__).resolve().parent
    assert root == here / "reference_posteriors" == posteriors.IN_REPO_ROOT
    assert posteriors.reference_available()
    for name in REFERENCE_POSTERIORS:
        for filename in FILES:
            path = posteriors.reference_file(name, filename)
            assert path is not None and path.is_relative_to(root), (name, filename)
    for filename in ["README.md", "LICENCE.posteriordb.md", "CITATION.posteriordb.cff"]:
        assert (root / filename).is_file()
    assert "28f8d3d6e975315f42aa274a8399f21e07a43b30" in (root / "README.md").read_text(encoding="utf-8")


def test_load_json_reads_gzip_when_plain_file_absent(monkeypatch, tmp_path):
    folder = tmp_path / "p"
    folder.mkdir()
    with gzip.open(folder / "a.json.gz", "wt", encoding="utf-8") as f:
        json.dump({"x": [1.5, 2.5]}, f)
    (folder / "b.json").write_text(json.dumps({"plain": True}))
    with gzip.open(folder / "b.json.gz", "wt", encoding="utf-8") as f:
        json.dump({"plain": False}, f)
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert posteriors.reference_file("p", "a.json") == (folder / "a.json.gz").resolve()
    assert posteriors.load_json("p", "a.json") == {"x": [1.5, 2.5]}
    assert posteriors.load_json("p", "a.json") is posteriors.load_json("p", "a.json")  # cached
    assert posteriors.load_json("p", "b.json") == {"plain": True}  # the plain file wins
    assert posteriors.reference_file("p", "c.json") is None
    with pytest.raises(FileNotFoundError, match="c.json.gz"):
        posteriors.load_json("p", "c.json")


def test_unavailable_reason_says_how_to_fix(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "missing"))
    assert not posteriors.reference_available()
    reason = posteriors.unavailable_reason()
    assert ENV_VAR in reason and "unset" in reason and str(posteriors.IN_REPO_ROOT) in reason
    monkeypatch.delenv(ENV_VAR)
    monkeypatch.setattr(posteriors, "IN_REPO_ROOT", tmp_path / "gone")
    assert not posteriors.reference_available()
    reason = posteriors.unavailable_reason()
    assert "tests/validation/reference_posteriors" in reason and ENV_VAR in reason
