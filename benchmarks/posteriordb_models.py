"""Nine posteriordb posteriors that dhmc's tests and other benchmarks do not use, written as NumPyro models from their
Stan code (same priors and constraints; flat where Stan is flat), each with the function that makes its data from
posteriordb's data file. Read by :mod:`benchmarks.posteriordb_outside`."""
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

flat = lambda support=constraints.real, event=(): dist.ImproperUniform(support, (), event)


# ---- kilpisjarvi_mod-kilpisjarvi --------------------------------------------------------------
def kilpisjarvi(x, y, pmualpha, psalpha, pmubeta, psbeta):
    alpha = numpyro.sample("alpha", dist.Normal(pmualpha, psalpha))
    beta = numpyro.sample("beta", dist.Normal(pmubeta, psbeta))
    sigma = numpyro.sample("sigma", flat(constraints.positive))
    numpyro.sample("y", dist.Normal(alpha + beta * x, sigma), obs=y)


def kilpisjarvi_data(d):
    return dict(x=np.asarray(d["x"], float), y=np.asarray(d["y"], float), pmualpha=float(d["pmualpha"]),
                psalpha=float(d["psalpha"]), pmubeta=float(d["pmubeta"]), psbeta=float(d["psbeta"]))


# ---- garch-garch11 ----------------------------------------------------------------------------
def _garch_likelihood(y, sigma1, mu, alpha0, alpha1, beta1):
    """GARCH(1,1)'s observations given its parameters: each volatility from the previous one and observation."""

    def step(s_prev, y_prev):
        s = jnp.sqrt(alpha0 + alpha1 * (y_prev - mu) ** 2 + beta1 * s_prev**2)
        return s, s

    _, rest = jax.lax.scan(step, sigma1 + 0.0 * mu, y[:-1])
    sigma = jnp.concatenate([jnp.reshape(sigma1 + 0 * mu, (1,)), rest])
    numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def garch11(y, sigma1):
    mu = numpyro.sample("mu", flat())
    alpha0 = numpyro.sample("alpha0", flat(constraints.positive))
    alpha1 = numpyro.sample("alpha1", flat(constraints.unit_interval))
    # Stan: real<lower=0, upper=(1 - alpha1)> beta1 with no statement: flat on (0, 1 - alpha1) (unnormalised)
    beta1 = numpyro.sample("beta1", flat(constraints.interval(0.0, 1.0 - alpha1)))
    _garch_likelihood(y, sigma1, mu, alpha0, alpha1, beta1)


def garch11_reparam(y, sigma1):
    """The same posterior without a support that depends on another site: Stan's own transform of beta1,
    beta1 = (1 - alpha1) * beta1_raw with beta1_raw in (0, 1), and its Jacobian log(1 - alpha1), by hand."""
    mu = numpyro.sample("mu", flat())
    alpha0 = numpyro.sample("alpha0", flat(constraints.positive))
    alpha1 = numpyro.sample("alpha1", flat(constraints.unit_interval))
    beta1_raw = numpyro.sample("beta1_raw", flat(constraints.unit_interval))
    beta1 = numpyro.deterministic("beta1", (1.0 - alpha1) * beta1_raw)
    numpyro.factor("beta1_jacobian", jnp.log1p(-alpha1))
    _garch_likelihood(y, sigma1, mu, alpha0, alpha1, beta1)


def garch11_data(d):
    return dict(y=np.asarray(d["y"], float), sigma1=float(d["sigma1"]))


# ---- arma-arma11 ------------------------------------------------------------------------------
def arma11(y):
    mu = numpyro.sample("mu", dist.Normal(0, 10))
    phi = numpyro.sample("phi", dist.Normal(0, 2))
    theta = numpyro.sample("theta", dist.Normal(0, 2))
    sigma = numpyro.sample("sigma", dist.HalfCauchy(2.5))
    nu1 = mu + phi * mu
    err1 = y[0] - nu1

    def step(err_prev, ys):
        y_prev, y_t = ys
        nu = mu + phi * y_prev + theta * err_prev
        e = y_t - nu
        return e, e

    _, rest = jax.lax.scan(step, err1, (y[:-1], y[1:]))
    err = jnp.concatenate([jnp.reshape(err1, (1,)), rest])
    numpyro.factor("err_lik", dist.Normal(0, sigma).log_prob(err).sum())


def arma11_data(d):
    return dict(y=np.asarray(d["y"], float))


# ---- diamonds-diamonds ------------------------------------------------------------------------
def diamonds(Xc, Y):
    Kc = Xc.shape[1]
    b = numpyro.sample("b", dist.Normal(0, 1).expand([Kc]).to_event(1))
    intercept = numpyro.sample("Intercept", dist.StudentT(3, 8, 10))
    sigma = numpyro.sample("sigma", dist.LeftTruncatedDistribution(dist.StudentT(3, 0, 10), low=0.0))
    numpyro.sample("Y", dist.Normal(intercept + Xc @ b, sigma), obs=Y)


def diamonds_data(d):
    X = np.asarray(d["X"], float)
    Xc = X[:, 1:] - X[:, 1:].mean(0)
    return dict(Xc=Xc, Y=np.asarray(d["Y"], float))


# ---- earnings-logearn_interaction -------------------------------------------------------------
def logearn_interaction(log_earn, height, male):
    beta = numpyro.sample("beta", flat(constraints.real_vector, (4,)))
    sigma = numpyro.sample("sigma", flat(constraints.positive))
    mu = beta[0] + beta[1] * height + beta[2] * male + beta[3] * height * male
    numpyro.sample("log_earn", dist.Normal(mu, sigma), obs=log_earn)


def logearn_interaction_data(d):
    return dict(log_earn=np.log(np.asarray(d["earn"], float)), height=np.asarray(d["height"], float),
                male=np.asarray(d["male"], float))


# ---- gp_pois_regr-gp_pois_regr ----------------------------------------------------------------
def gp_pois_regr(x, k):
    N = x.shape[0]
    rho = numpyro.sample("rho", dist.Gamma(25, 4))
    alpha = numpyro.sample("alpha", dist.HalfNormal(2))
    f_tilde = numpyro.sample("f_tilde", dist.Normal(0, 1).expand([N]).to_event(1))
    d2 = (x[:, None] - x[None, :]) ** 2
    cov = alpha**2 * jnp.exp(-0.5 * d2 / rho**2) + 1e-10 * jnp.eye(N)
    L = jnp.linalg.cholesky(cov)
    f = numpyro.deterministic("f", L @ f_tilde)
    numpyro.sample("k", dist.Poisson(jnp.exp(f)), obs=k)


def gp_pois_regr_data(d):
    return dict(x=np.asarray(d["x"], float), k=np.asarray(d["k"], int))


# ---- mesquite-logmesquite_logvash -------------------------------------------------------------
def logmesquite_logvash(log_weight, lcv, lca, lcs, lth, group):
    beta = numpyro.sample("beta", flat(constraints.real_vector, (6,)))
    sigma = numpyro.sample("sigma", flat(constraints.positive))
    mu = beta[0] + beta[1] * lcv + beta[2] * lca + beta[3] * lcs + beta[4] * lth + beta[5] * group
    numpyro.sample("log_weight", dist.Normal(mu, sigma), obs=log_weight)


def logmesquite_logvash_data(d):
    a = {k: np.asarray(d[k], float) for k in ("weight", "diam1", "diam2", "canopy_height", "total_height", "group")}
    return dict(log_weight=np.log(a["weight"]), lcv=np.log(a["diam1"] * a["diam2"] * a["canopy_height"]),
                lca=np.log(a["diam1"] * a["diam2"]), lcs=np.log(a["diam1"] / a["diam2"]),
                lth=np.log(a["total_height"]), group=a["group"])


# ---- nes2000-nes ------------------------------------------------------------------------------
def nes(X, partyid7):
    beta = numpyro.sample("beta", flat(constraints.real_vector, (9,)))
    sigma = numpyro.sample("sigma", flat(constraints.positive))
    numpyro.sample("partyid7", dist.Normal(beta[0] + X @ beta[1:], sigma), obs=partyid7)


def nes_data(d):
    age = np.asarray(d["age_discrete"])
    cols = [d["real_ideo"], d["race_adj"], age == 2, age == 3, age == 4, d["educ1"], d["gender"], d["income"]]
    return dict(X=np.stack([np.asarray(c, float) for c in cols], 1), partyid7=np.asarray(d["partyid7"], float))


# ---- hmm_example-hmm_example ------------------------------------------------------------------
def hmm_example(y):
    K = 2
    theta1 = numpyro.sample("theta1", dist.Dirichlet(jnp.ones(K)))  # Stan: simplex, no prior = uniform
    theta2 = numpyro.sample("theta2", dist.Dirichlet(jnp.ones(K)))
    mu = numpyro.sample("mu", flat(constraints.positive_ordered_vector, (K,)))
    numpyro.factor("mu_prior", dist.Normal(3, 1).log_prob(mu[0]) + dist.Normal(10, 1).log_prob(mu[1]))
    log_theta = jnp.log(jnp.stack([theta1, theta2]))  # [j, k]: from j to k
    emit = dist.Normal(mu, 1).log_prob(y[:, None])  # (N, K)

    def step(gamma_prev, e_t):
        g = jax.nn.logsumexp(gamma_prev[:, None] + log_theta, axis=0) + e_t
        return g, None

    gamma_N, _ = jax.lax.scan(step, emit[0], emit[1:])
    numpyro.factor("lik", jax.nn.logsumexp(gamma_N))


def hmm_example_data(d):
    assert int(d["K"]) == 2
    return dict(y=np.asarray(d["y"], float))


MODELS = {
    "kilpisjarvi_mod-kilpisjarvi": (kilpisjarvi, kilpisjarvi_data),
    "garch-garch11": (garch11_reparam, garch11_data),
    "garch-garch11:depsupport": (garch11, garch11_data),  # beta1 ~ ImproperUniform(interval(0, 1 - alpha1))
    "arma-arma11": (arma11, arma11_data),
    "diamonds-diamonds": (diamonds, diamonds_data),
    "earnings-logearn_interaction": (logearn_interaction, logearn_interaction_data),
    "gp_pois_regr-gp_pois_regr": (gp_pois_regr, gp_pois_regr_data),
    "mesquite-logmesquite_logvash": (logmesquite_logvash, logmesquite_logvash_data),
    "nes2000-nes": (nes, nes_data),
    "hmm_example-hmm_example": (hmm_example, hmm_example_data),
}
