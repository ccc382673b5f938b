"""What mutual TLS on loopback costs the embedded cluster: its start-up, and a run's blocks.

Each measurement is a fresh process (imports, certificates, workers, compile from the persistent cache),
alternating TLS (dhmc's default: per-run certificates) and plain TCP (``security=Security()``), so that
the machine's load hits both alike. Per process: the seconds to make the certificates, to start the
cluster until its workers are connected, and to sample a run of many short blocks (the contract's
logistic-regression size cut to 256 chains in blocks of 16, fixed HMC), and the CPU seconds of the
driver and of its worker processes. Reports medians and the TLS / plain ratios.

    python -m benchmarks.tls_cost                 # 5 pairs: results/tls_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks.harness import RESULTS, write_json
from benchmarks.machine import machine

ONE = r"""
import json, os, resource, sys, time
plain = sys.argv[1] == "plain"
t = time.perf_counter()
import jax, jax.numpy as jnp, numpy as np
import dhmc
from distributed import Client
from distributed.security import Security
from dhmc.distributed import network
from dhmc.distributed.embedded import local_cluster
imports = time.perf_counter() - t
t = time.perf_counter()
security = network.security_for(None, Security() if plain else None)
certificates = time.perf_counter() - t
t = time.perf_counter()
cluster = local_cluster(2, security=security)
client = Client(cluster, set_as_default=False)
client.wait_for_workers(2)
start = time.perf_counter() - t
X = np.random.default_rng(0).normal(size=(1000, 10)).astype(np.float32)
y = (X @ np.linspace(-1, 1, 10) > 0).astype(np.float32)
def logdensity(p):
    z = X @ p["w"]
    return jnp.sum(y * z - jnp.logaddexp(0.0, z)) - 0.5 * jnp.sum(p["w"] ** 2)
kw = dict(init={"w": jnp.zeros(10)}, chains=256, chains_per_task=16, draws=200, warmup=0, adapt=False,
          kernel="hmc", step_size=0.02, num_steps=10, progress=False, cluster=client, seed=1)
dhmc.sample(logdensity, **{**kw, "draws": 10})  # compile on the workers
t = time.perf_counter()
dhmc.sample(logdensity, **kw)
run = time.perf_counter() - t
client.close(); cluster.close()
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"certificates_s": certificates, "start_s": start, "run_s": run, "imports_s": imports,
                  "driver_cpu_s": me.ru_utime + me.ru_stime, "workers_cpu_s": kids.ru_utime + kids.ru_stime,
                  "load": os.getloadavg()[0]}))
"""


def one(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", ONE, mode], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return {"mode": mode, **json.loads(out.stdout.strip().splitlines()[-1])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--out", default=str(RESULTS / "tls_cost.json"))
    args = p.parse_args(argv)
    rows = []
    for i in range(args.pairs):
        for mode in (("tls", "plain") if i % 2 == 0 else ("plain", "tls")):
            rows.append(one(mode))
            print(json.dumps(rows[-1]), flush=True)
    keys = ("certificates_s", "start_s", "run_s", "driver_cpu_s", "workers_cpu_s")
    medians = {mode: {k: statistics.median(r[k] for r in rows if r["mode"] == mode) for k in keys}
               for mode in ("tls", "plain")}
    ratios = {k: medians["tls"][k] / medians["plain"][k] for k in keys if medians["plain"][k] > 0}
    for k in keys:
        print(f"{k:16s} tls {medians['tls'][k]:8.3f}  plain {medians['plain'][k]:8.3f}"
              + (f"  ratio {ratios[k]:.3f}" if k in ratios else ""))
    write_json(args.out, {"machine": machine(), "pairs": args.pairs, "medians": medians, "tls_over_plain": ratios,
                          "runs": rows, "pid": os.getpid()})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
