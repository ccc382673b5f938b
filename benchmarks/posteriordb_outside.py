"""dhmc and NumPyro NUTS on posteriordb posteriors from outside this repo (:mod:`benchmarks.posteriordb_models`),
each against posteriordb's reference draws by ``tests/validation/compare.py``'s rule.

dhmc: ``dhmc.sample(model, model_kwargs=data, chains=1024, draws="auto", target_ess=400)``, its defaults otherwise;
sequential gradients a chain = the warmup rounds' ``grad_evals`` / chains + chain 0's summed ``n_steps`` (as
``many_chains.py``). NUTS: 4 chains x (1000 warmup + 1000 draws), sequential, its gradients the largest chain's
``num_steps`` over the draws (the check that the model is right: a posterior NUTS gets wrong is a model to mend
first). Each run in its own process (``--x64`` is process-wide); reference moments from the reference draws, their
Monte Carlo error ``sd / sqrt(ESS)``. Needs a posteriordb clone (or a bare mirror), given by ``--posteriordb``::

    python -m benchmarks.posteriordb_outside --posteriordb ~/posteriordb --out outside.json
    python -m benchmarks.posteriordb_outside --posteriordb ~/posteriordb --posteriors kilpisjarvi_mod-kilpisjarvi \\
        --samplers dhmc --x64
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
import traceback
import warnings
import zipfile
from pathlib import Path

import numpy as np

from benchmarks.machine import machine
from benchmarks.posteriordb_models import MODELS


def read(root: str, path: str) -> bytes:
    """``posterior_database/<path>`` of a posteriordb clone, or of a bare mirror (``git show``)."""
    file = Path(root) / "posterior_database" / path
    if file.exists():
        return file.read_bytes()
    return subprocess.run(["git", "-C", root, "show", f"HEAD:posterior_database/{path}"], check=True,
                          capture_output=True).stdout


def _json_zip(blob: bytes):
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        return json.loads(z.read(z.namelist()[0]))


def data(root: str, name: str) -> dict:
    info = json.loads(read(root, f"posteriors/{name}.json"))
    return _json_zip(read(root, f"data/data/{info['data_name']}.json.zip"))


def reference(root: str, name: str) -> tuple[list[str], dict]:
    """The reference's parameter names and ``{name: (mean, sd, mcse)}``."""
    import arviz

    chains = _json_zip(read(root, f"reference_posteriors/draws/draws/{name}.json.zip"))
    names, moments = list(chains[0]), {}
    for k in names:
        x = np.array([c[k] for c in chains], np.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ess = float(arviz.ess(x))
        sd = float(x.std(ddof=1))
        moments[k] = (float(x.mean()), sd, sd / np.sqrt(ess) if ess > 0 else float("inf"))
    return names, moments


def stan_names(samples: dict, wanted) -> dict:
    """``{site: (chain, draw, k...)}`` as Stan's ``site[i,j]`` (1-based), keeping the names in ``wanted``."""
    out = {}
    for k, v in samples.items():
        v = np.asarray(v, np.float64)
        for idx in np.ndindex(*v.shape[2:]):
            out[f"{k}[{','.join(str(j + 1) for j in idx)}]" if idx else k] = v[(slice(None), slice(None)) + idx]
    return {k: v for k, v in out.items() if k in wanted}


def run_one(cfg: dict) -> dict:
    """One posterior by one sampler, in this process."""
    import jax

    jax.config.update("jax_enable_x64", cfg["x64"])
    from tests.validation.compare import compare

    variant = cfg["posterior"]
    name = variant.split(":")[0]
    model, make_data = MODELS[variant]
    model_data = make_data(data(cfg["posteriordb"], name))
    required, moments = reference(cfg["posteriordb"], name)
    row = dict(cfg)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cfg["sampler"] == "dhmc":
            import dhmc

            tree = dhmc.sample(model, model_kwargs=model_data, chains=cfg["chains"], draws="auto", target_ess=400,
                               seed=cfg["seed"], progress=False)
            post = tree["posterior"]
            samples = {k: post[k].values for k in post.data_vars}
            history = json.loads(post.attrs.get("dhmc_warmup", "[]"))
            n_steps = np.asarray(tree["sample_stats"]["n_steps"].values, np.int64)
            warm = sum(int(r.get("grad_evals", 0)) for r in history) / cfg["chains"]
            row.update(draws=int(post.sizes["draw"]), seq_grads=warm + int(n_steps[0].sum()), warmup_grads=warm,
                       cold_grads=sum(int(r["grad_evals"]) for r in history if r.get("phase") == "cold")
                       / cfg["chains"], dense_mass=json.loads(post.attrs["dhmc_run_spec"]).get("dense_mass"),
                       divergences=int(tree["sample_stats"]["diverging"].values.sum()))
        else:
            from numpyro.infer import MCMC, NUTS

            mcmc = MCMC(NUTS(model), num_warmup=1000, num_samples=1000, num_chains=4, chain_method="sequential",
                        progress_bar=False)
            mcmc.run(jax.random.PRNGKey(cfg["seed"]), **model_data, extra_fields=("num_steps", "diverging"))
            samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
            extra = mcmc.get_extra_fields(group_by_chain=True)
            row.update(draws=1000, divergences=int(np.asarray(extra["diverging"]).sum()),
                       sampling_grads=int(np.asarray(extra["num_steps"]).sum(1).max()))
    row["s"] = time.perf_counter() - start
    report = compare(stan_names(samples, set(moments) | set(required)), name, moments=moments, required=required,
                     label=cfg["sampler"])
    print(report)
    row.update(correct=report.passed, max_abs_z=report.max_abs_z, min_ess_bulk=report.min_ess,
               failures=[p.line() for p in report.failures],
               warnings=sorted({f"{w.category.__name__}: {w.message}" for w in caught
                                if w.category.__name__ in ("ConvergenceWarning", "RuntimeWarning")}))
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--posteriordb", required=True, help="a posteriordb clone or bare mirror")
    ap.add_argument("--posteriors", default=",".join(MODELS))
    ap.add_argument("--samplers", default="dhmc,nuts")
    ap.add_argument("--x64", action="store_true")
    ap.add_argument("--chains", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1200.0)
    ap.add_argument("--out", default="posteriordb_outside.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("ROW " + json.dumps(run_one(json.loads(args.child)), default=str))
        return
    rows, start = [], time.perf_counter()
    for posterior in args.posteriors.split(","):
        for sampler in args.samplers.split(","):
            cfg = dict(posterior=posterior, sampler=sampler, x64=args.x64, chains=args.chains if sampler == "dhmc"
                       else 4, seed=args.seed, posteriordb=str(Path(args.posteriordb).expanduser()))
            try:
                done = subprocess.run([sys.executable, "-m", "benchmarks.posteriordb_outside", "--posteriordb",
                                       cfg["posteriordb"], "--child", json.dumps(cfg)], capture_output=True, text=True,
                                      timeout=args.timeout)
                found = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
                row = json.loads(found[-1]) if found else dict(cfg, error=done.stderr[-3000:])
            except subprocess.TimeoutExpired:
                row = dict(cfg, error=f"timed out after {args.timeout:.0f} s")
            except Exception:  # noqa: BLE001 - one posterior's failure is a row, not the end of the sweep
                row = dict(cfg, error=traceback.format_exc())
            rows.append(row)
            print(f"{posterior} {sampler}: " + (f"error {row['error'][-200:]}" if "error" in row else
                  f"{'right' if row['correct'] else 'WRONG'}, {row.get('seq_grads', row.get('sampling_grads'))} "
                  f"gradients a chain, {row['s']:.0f} s"), flush=True)
    Path(args.out).write_text(json.dumps({"benchmark": "posteriordb_outside", "machine": machine(),
                                          "wall_s": time.perf_counter() - start, "runs": rows}, indent=1,
                                         default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
