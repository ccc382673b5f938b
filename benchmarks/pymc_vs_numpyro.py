"""One PyMC model, two samplers: ``dhmc.sample(model)`` against ``pm.sample(nuts_sampler="numpyro")``.

Each sampler runs in a process of its own (PyMC's JAX backend sets ``XLA_FLAGS`` to 100 host devices at import),
on the same model built by the same function (``tests/validation/pymc_models.py``), with its defaults: PyMC 4
chains x (1000 tune + 1000 draws), NumPyro NUTS, chains in parallel; dhmc 128 chains x 1000 draws, warmup
"auto", on its embedded cluster (one worker per core). Wall seconds are the whole call (compilation, cluster
start, PyMC's import on the workers included; the parent's import of PyMC not). ESS is ArviZ's bulk ESS, the
minimum over every scalar of the posterior. Also writes each trace's layout (groups, variables, dims, coords).

    python -m benchmarks.pymc_vs_numpyro [--model eight_schools-eight_schools_noncentered] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

RUN = r'''
import json, sys, time, warnings
warnings.simplefilter("ignore")
import arviz as az
import numpy as np
from tests.validation.pymc_models import PYMC_MODELS
sampler, name, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = PYMC_MODELS[name]()
if sampler == "dhmc":
    import dhmc
    t0 = time.perf_counter()
    tree = dhmc.sample(model, chains=128, draws=1000, seed=seed, progress=False, log_likelihood=True)
    seconds = time.perf_counter() - t0
    idata = az.InferenceData.from_datatree(tree)
    grads = None
    timing = json.loads(tree["posterior"].attrs["dhmc_timing"])
else:
    import pymc as pm
    t0 = time.perf_counter()
    idata = pm.sample(draws=1000, tune=1000, chains=4, model=model, nuts_sampler="numpyro", random_seed=seed,
                      progressbar=False, idata_kwargs={"log_likelihood": True})
    seconds = time.perf_counter() - t0
    timing = None
ess = az.ess(idata, method="bulk")
min_ess = float(min(float(v.min()) for v in ess.data_vars.values()))
layout = {g: {"vars": {k: list(v.dims) for k, v in idata[g].data_vars.items()},
              "coords": {k: [str(c) for c in v.values] for k, v in idata[g].coords.items() if k not in ("chain", "draw")}}
          for g in idata.groups()}
print(json.dumps({"sampler": sampler, "seconds": seconds, "min_ess_bulk": min_ess, "ess_per_s": min_ess / seconds,
                  "chains": int(idata.posterior.sizes["chain"]), "draws": int(idata.posterior.sizes["draw"]),
                  "divergences": int(idata.sample_stats["diverging"].sum()), "timing": timing, "layout": layout}))
'''


def main(argv=None):
    from benchmarks.machine import machine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="eight_schools-eight_schools_noncentered")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "pymc_vs_numpyro.json"))
    args = parser.parse_args(argv)
    runs = []
    for sampler in ("pymc-numpyro", "dhmc"):
        done = subprocess.run([sys.executable, "-c", RUN, sampler, args.model, str(args.seed)], capture_output=True,
                              text=True, timeout=3000, cwd=Path(__file__).resolve().parent.parent)
        if done.returncode:
            raise SystemExit(f"{sampler} failed:\n{done.stderr[-3000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        r = runs[-1]
        print(f"{sampler:13s} {r['chains']:4d} x {r['draws']} draws  {r['seconds']:7.1f} s  min bulk ESS "
              f"{r['min_ess_bulk']:8.0f}  ESS/s {r['ess_per_s']:7.1f}  divergences {r['divergences']}")
    same = {g: runs[0]["layout"][g] == runs[1]["layout"].get(g) for g in runs[0]["layout"] if g != "sample_stats"}
    print("same layout (groups but sample_stats):", same)
    result = {"model": args.model, "seed": args.seed, "runs": runs, "same_layout": same, "machine": machine()}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}; cpu: {result['machine']['cpu']}")


if __name__ == "__main__":
    main()
