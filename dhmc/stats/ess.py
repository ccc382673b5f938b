"""Bulk, tail and sd effective sample sizes of many chains (pure NumPy): ArviZ's bulk and tail ESS, without
importing it, and the ESS of a scalar's sd."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["KURTOSIS_SE", "ess_bulk", "ess_sd", "ess_tail"]

KURTOSIS_SE = 2.0  # ess_sd's kurtosis: the estimate plus this many of its standard errors
_BATCH_DRAWS = 2 ** 22  # ESS takes the scalars in batches of about this many draws: its memory is some 10 times theirs


def ess_bulk(draws: np.ndarray):
    """Bulk effective sample size of ``draws`` shaped ``(chains, draws, ...)``, vectorized over trailing dims.

    ArviZ 0.23's ``ess(method="bulk")`` (Vehtari et al. 2021): Geyer's initial monotone sequence over
    the split chains of the rank-normalized draws. Constant draws give the number of split draws, as
    in ArviZ; a scalar with a NaN draw, or fewer than 4 draws per chain, NaN. A float for 2-d
    ``draws``, else an array over the trailing dims.
    """
    chains, n = np.shape(draws)[:2]
    rank_quantiles = _rank_quantiles(2 * chains * (n // 2))  # the split draws', shared by every scalar
    return _by_scalar(draws, lambda x: _ess(_z_scale(_split_chains(x), rank_quantiles)))


def ess_tail(draws: np.ndarray):
    """Tail effective sample size of ``draws`` shaped ``(chains, draws, ...)``, vectorized over trailing dims.

    ArviZ 0.23's ``ess(method="tail")``: the smaller ESS of the indicators ``draws <= q`` for ``q``
    the 5% and the 95% quantile (R's type 7) of the scalar's draws. Undefined cases as :func:`ess_bulk`.
    """
    return _by_scalar(draws, _tail_ess)


def ess_sd(draws: np.ndarray):
    """The sd's effective sample size of ``draws`` shaped ``(chains, draws, ...)``: the number of independent
    draws from a normal that would give each scalar's sd as precisely.

    The ESS of the squared deviations ``(x - mean)^2`` (Geyer's, over the split chains: ArviZ's
    ``ess(method="mean")`` of them) times ``2 / (kurtosis - 1)``: by the delta method a sd's relative error is
    ``sqrt((kurtosis - 1) / (4 ESS))``, a normal's ``1 / sqrt(2 ESS)``. About that ESS for a normal scalar;
    a heavy tail, whose few far draws carry the variance, needs that many more. The kurtosis taken is its
    estimate plus :data:`KURTOSIS_SE` standard errors (from the spread of the chains' own means of the
    standardised fourth power; one chain's halves): read from a tail that few chains have reached it is mostly too
    low, and then uncertain (the Brownian motion's observation scale, exact 24.3: 14.6 +- 2.5 from 1024 chains x
    80 draws, whose sd was 10% narrow). Constant draws give the number of split draws; undefined cases as
    :func:`ess_bulk`.
    """
    return _by_scalar(draws, _sd_ess)


def _by_scalar(draws: np.ndarray, ess):
    """``ess`` of each scalar of ``draws`` (chains, draws, ...), given as (scalars, chains, draws) batches of at
    most about :data:`_BATCH_DRAWS` draws; NaN with a NaN draw (all, without chains or 4 draws per chain)."""
    chains, n, *shape = np.shape(draws)
    scalars = np.moveaxis(np.reshape(draws, (chains, n, math.prod(shape))), 2, 0)
    result = np.full(len(scalars), np.nan)
    if chains and n >= 4:
        step = max(1, _BATCH_DRAWS // (chains * n))
        for start in range(0, len(scalars), step):
            result[start:start + step] = _unless_nan(np.asarray(scalars[start:start + step], float), ess)
    return float(result[0]) if not shape else result.reshape(shape)


def _unless_nan(x: np.ndarray, ess) -> np.ndarray:
    """``ess`` of the scalars of ``x`` (scalars, chains, draws) without a NaN draw, NaN for the others."""
    valid = ~np.isnan(x).any(axis=(1, 2))
    result = np.full(len(x), np.nan)
    if valid.any():
        result[valid] = ess(x[valid])
    return result


def _tail_ess(x: np.ndarray) -> np.ndarray:
    """ArviZ's tail ESS of each scalar's (chains, draws) ``x``."""
    low, high = _quantiles(x, (0.05, 0.95)).T
    return np.minimum(_ess(_split_chains(x <= low[:, None, None])), _ess(_split_chains(x <= high[:, None, None])))


def _sd_ess(x: np.ndarray) -> np.ndarray:
    """:func:`ess_sd` of each scalar's (chains, draws) ``x``."""
    squares = np.square(x - x.mean(axis=(1, 2), keepdims=True))
    second = squares.mean(axis=(1, 2))
    constant = second <= 0
    fourth = np.square(squares) / np.where(constant, 1.0, second**2)[:, None, None]  # standardised
    groups = (fourth if x.shape[1] > 1 else _split_chains(fourth)).mean(axis=2)  # each chain's mean
    margin = KURTOSIS_SE * groups.std(axis=1, ddof=1) / math.sqrt(groups.shape[1])
    excess = np.where(constant, 2.0, fourth.mean(axis=(1, 2)) + margin - 1.0)  # kurtosis - 1: a normal's 2
    return _ess(_split_chains(squares)) * 2.0 / np.maximum(excess, 2e-12)


def _split_chains(x: np.ndarray) -> np.ndarray:
    """Each chain's first and last halves as chains: (scalars, chains, draws) -> (scalars, 2 chains, draws // 2)."""
    half = x.shape[2] // 2
    return np.concatenate([x[:, :, :half], x[:, :, x.shape[2] - half:]], axis=1)


def _quantiles(x: np.ndarray, probs) -> np.ndarray:
    """Each scalar's R type-7 quantiles ``probs`` over all its draws, (scalars, probs): ArviZ's (scipy's
    ``mquantiles(alphap=1, betap=1)``), to the last bit."""
    flat = x.reshape(len(x), -1)
    n, p = flat.shape[1], np.asarray(probs, float)
    aleph = n * p + (1.0 - p)
    k = np.floor(aleph.clip(1, n - 1)).astype(int)
    gamma = (aleph - k).clip(0, 1)
    ordered = np.partition(flat, np.unique(np.concatenate([k - 1, k])), axis=1)
    return (1.0 - gamma) * ordered[:, k - 1] + gamma * ordered[:, k]


def _rank_quantiles(n: int) -> np.ndarray:
    """The normal quantile of every average rank 1, 1.5, ..., n among ``n`` draws, at ArviZ's fractional
    rank ``(rank - 3/8) / (n + 1/4)``."""
    blom = 3 / 8
    return _normal_quantile((np.arange(2, 2 * n + 1) / 2 - blom) / (n - 2 * blom + 1))


def _z_scale(x: np.ndarray, rank_quantiles: np.ndarray) -> np.ndarray:
    """ArviZ's rank normalization of each scalar's draws over all its chains: the :func:`_rank_quantiles` of
    their ranks, tied draws sharing their average rank, (first + last position) / 2 + 1."""
    flat = x.reshape(len(x), -1)
    order = np.argsort(flat, axis=1)
    z = np.empty_like(flat)
    np.put_along_axis(z, order, rank_quantiles[_tie_position_sums(np.take_along_axis(flat, order, axis=1))], axis=1)
    return z.reshape(x.shape)


def _tie_position_sums(ordered: np.ndarray) -> np.ndarray:
    """For each value of each sorted row, the first plus the last position of its value in the row."""
    n = ordered.shape[1]
    changes = ordered[:, 1:] != ordered[:, :-1]
    boundary = np.ones((len(ordered), 1), bool)
    positions = np.arange(n)
    first = np.maximum.accumulate(np.where(np.hstack([boundary, changes]), positions, 0), axis=1)
    last = np.minimum.accumulate(np.where(np.hstack([changes, boundary]), positions, n)[:, ::-1], axis=1)[:, ::-1]
    return first + last


def _ess(x: np.ndarray) -> np.ndarray:
    """ArviZ's ``_ess`` (``relative=False``) of each scalar's (chains, draws) ``x``: chains x draws over the
    autocorrelation time, at most chains x draws x log10(chains x draws); chains x draws for constant draws."""
    x = np.asarray(x, float)
    chains, n = x.shape[1:]
    acov = _autocov(x)
    with np.errstate(divide="ignore", invalid="ignore"):  # constant draws: set apart below
        mean_var = acov[:, :, 0].mean(axis=1) * n / (n - 1.0)
        var_plus = mean_var * (n - 1.0) / n + x.mean(axis=2).var(axis=1, ddof=1)
        rho = 1.0 - (mean_var[:, None] - acov.mean(axis=1)) / var_plus[:, None]
    rho[:, 0] = 1.0
    size = chains * n
    ess = size / np.maximum(_autocorrelation_time(rho), 1 / np.log10(size))
    return np.where(np.ptp(x, axis=(1, 2)) < np.finfo(float).resolution, size, ess)


def _autocov(x: np.ndarray) -> np.ndarray:
    """Each chain's autocovariance (biased) at every lag, by FFT, as ArviZ's ``autocov``."""
    n = x.shape[-1]
    length = _fast_fft_length(2 * n)
    spectrum = np.fft.rfft(x - x.mean(axis=-1, keepdims=True), n=length, axis=-1)
    spectrum *= np.conjugate(spectrum)
    return np.fft.irfft(spectrum, n=length, axis=-1)[..., :n] / n


def _fast_fft_length(target: int) -> int:
    """The smallest 2^a 3^b 5^c >= ``target``: ArviZ's FFT length (scipy.fftpack's ``next_fast_len``)."""
    exponents = np.arange(int(np.log2(target)) + 2.0)
    smooth = 2 ** exponents[:, None, None] * 3 ** exponents[:, None] * 5 ** exponents
    return int(smooth[smooth >= target].min())


def _autocorrelation_time(rho: np.ndarray) -> np.ndarray:
    """Geyer's initial monotone sequence estimate ``-1 + 2 sum(rho)`` from each row of autocorrelations ``rho``
    (scalars, lags), as ArviZ's ``_ess``: the sums of lag pairs (0, 1), (2, 3)... are summed up to the first
    that is not positive (at most up to lag ``lags - 3``), each capped by the ones before, plus the stopping
    pair's even lag where it is positive or the pair's sum is not negative."""
    pairs = max(0, (rho.shape[1] - 3) // 2) + 1
    pair_sums = rho[:, :2 * pairs].reshape(len(rho), pairs, 2).sum(axis=2)
    stop = np.argmax(np.hstack([~(pair_sums[:, :-1] > 0), np.ones((len(rho), 1), bool)]), axis=1)[:, None]
    kept = np.where(np.arange(pairs) < stop, np.minimum.accumulate(pair_sums, axis=1), 0.0).sum(axis=1)
    even = np.take_along_axis(rho, 2 * stop, axis=1)[:, 0]
    even_kept = (np.take_along_axis(pair_sums, stop, axis=1)[:, 0] >= 0) | (even > 0)
    return -1.0 + 2.0 * kept + np.where(even_kept, even, 0.0)


def _normal_quantile(p: np.ndarray) -> np.ndarray:
    """The standard normal quantile of each ``p`` in (0, 1): Wichura's AS241 (relative error ~1e-16), as
    CPython's ``statistics.NormalDist.inv_cdf`` (scipy.special's ``ndtri`` costs ~0.2 s to import)."""
    q = p - 0.5
    central = np.abs(q) <= 0.425
    z = np.empty_like(p)
    q_central = q[central]
    r = 0.180625 - q_central * q_central
    z[central] = np.polyval(_AS241_CENTRAL[0], r) * q_central / np.polyval(_AS241_CENTRAL[1], r)
    p_tail, q_tail = p[~central], q[~central]
    r = np.sqrt(-np.log(np.where(q_tail <= 0.0, p_tail, 1.0 - p_tail)))
    near, far = r - 1.6, r - 5.0
    x = np.where(r <= 5.0, np.polyval(_AS241_NEAR[0], near) / np.polyval(_AS241_NEAR[1], near),
                 np.polyval(_AS241_FAR[0], far) / np.polyval(_AS241_FAR[1], far))
    z[~central] = np.where(q_tail < 0.0, -x, x)
    return z


# AS241's rational approximations (numerator, denominator; highest degree first): |p - 1/2| <= 0.425, then in
# r = sqrt(-log(min(p, 1 - p))) for r <= 5 and beyond
_AS241_CENTRAL = ([2.5090809287301226727e+3, 3.3430575583588128105e+4, 6.7265770927008700853e+4,
                   4.5921953931549871457e+4, 1.3731693765509461125e+4, 1.9715909503065514427e+3,
                   1.3314166789178437745e+2, 3.3871328727963666080e+0],
                  [5.2264952788528545610e+3, 2.8729085735721942674e+4, 3.9307895800092710610e+4,
                   2.1213794301586595867e+4, 5.3941960214247511077e+3, 6.8718700749205790830e+2,
                   4.2313330701600911252e+1, 1.0])
_AS241_NEAR = ([7.74545014278341407640e-4, 2.27238449892691845833e-2, 2.41780725177450611770e-1,
                1.27045825245236838258e+0, 3.64784832476320460504e+0, 5.76949722146069140550e+0,
                4.63033784615654529590e+0, 1.42343711074968357734e+0],
               [1.05075007164441684324e-9, 5.47593808499534494600e-4, 1.51986665636164571966e-2,
                1.48103976427480074590e-1, 6.89767334985100004550e-1, 1.67638483018380384940e+0,
                2.05319162663775882187e+0, 1.0])
_AS241_FAR = ([2.01033439929228813265e-7, 2.71155556874348757815e-5, 1.24266094738807843860e-3,
               2.65321895265761230930e-2, 2.96560571828504891230e-1, 1.78482653991729133580e+0,
               5.46378491116411436990e+0, 6.65790464350110377720e+0],
              [2.04426310338993978564e-15, 1.42151175831644588870e-7, 1.84631831751005468180e-5,
               7.86869131145613259100e-4, 1.48753612908506148525e-2, 1.36929880922735805310e-1,
               5.99832206555887937690e-1, 1.0])
