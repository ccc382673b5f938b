#!/usr/bin/env bash
# One prepared script for a lent GPU machine, two stages:
#  1. throughput of fixed-step HMC on the GPU, dhmc vs the hand-written vmapped floor vs BlackJAX vs NumPyro
#     (vectorized), logistic regression N=1000 D=10, 2^10 and 2^14 chains (GPU_CHAINS for others), 190 s at most;
#  2. many_chains.py at 4096 chains: sequential gradients per chain to ESS 400 / R-hat 1.01, b^2 and seconds for
#     dhmc, BlackJAX LAPS, ChEES, MEADS on arK and the rotated 100-D Gaussian (GPU_MC_PROBLEMS, GPU_MC_SAMPLERS;
#     NumPyro NUTS's gradient counts do not depend on the device: its CPU row serves), 240 s at most;
#  3. what laplace= costs per ensemble gradient on the GPU (laplace_cost.py, 4096 chains), 45 s at most.
# Ends within 8 minutes; results are written after each measurement, so a run cut short keeps what it finished.
#
# Here first (the GPU machine cannot reach a registry):   bash benchmarks/fetch_wheels.sh   (fills .whl/)
# Then, from the repository root on the GPU machine (device tool: carry ".whl"):   bash benchmarks/gpu.sh
# The benchmarks run as modules from the repository root (python3 -m benchmarks.<name>): dhmc imports from there.
#
# dhmc runs on dask-cuda's LocalCUDACluster (cluster="cuda") when dask_cuda imports, else on a 1-worker
# distributed.LocalCluster (one GPU), with the whole ensemble in one block (chains_per_task = chains).
# Output: $OUT (or benchmarks/results/gpu/): many_chains_gpu.json, many_chains_peers_gpu.json, throughput_gpu.json,
# laplace_cost_gpu.json, their logs, nvidia-smi.txt.
set -u
cd "$(dirname "$(readlink -f "$0")")/.."
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "installing the carried wheels failed"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
{
  nvidia-smi || true
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())" || true
  python3 -c "import dask_cuda; print('dask_cuda', dask_cuda.__version__)" || echo "no dask_cuda: 1-GPU LocalCluster"
  python3 -c "import dask, distributed, zarr, numpyro; print('dask', dask.__version__, 'zarr', zarr.__version__, 'numpyro', numpyro.__version__)"
  python3 -c "import arviz, blackjax; print('arviz', arviz.__version__, 'blackjax', blackjax.__version__)" || echo "no arviz or blackjax: run fetch_wheels.sh and carry .whl"
} >"$OUT/nvidia-smi.txt" 2>&1
cat "$OUT/nvidia-smi.txt"
python3 -c "import jax, sys; sys.exit(0 if jax.default_backend() == 'gpu' else 'gpu.sh: JAX sees no GPU: install its CUDA build (deploy/README.md: pip install -U \"jax[cuda12]\")')" \
  || exit 1

set -o pipefail
# 1. many short chains, dhmc's defaults at 4096 chains (one block on the GPU), every problem, most telling first
timeout 230 python3 -m benchmarks.many_chains --gpu --chains "${GPU_MC_CHAINS:-4096}" --samplers dhmc \
  --problems "${GPU_MC_PROBLEMS:-gauss100_rot,arK,kidiq,eight_schools_noncentered,sblrc,low_dim_gauss_mix,funnel,eight_schools_centered,eight_schools-eight_schools_centered:laplace}" \
  --timeout 100 --out "$OUT/many_chains_gpu.json" 2>&1 | tee "$OUT/many_chains.log"
rc1=$?
[ $rc1 -eq 124 ] && echo "gpu.sh: dhmc's many-chains stage stopped at its 230 s limit; the JSON holds what finished"
# 2. the ensemble peers at the same size (NUTS's gradient counts do not depend on the device: its CPU row serves)
timeout 120 python3 -m benchmarks.many_chains --gpu --chains "${GPU_MC_CHAINS:-4096}" \
  --samplers "${GPU_MC_SAMPLERS:-chees,laps,meads}" --problems "${GPU_PEER_PROBLEMS:-arK,kidiq,gauss100_rot}" \
  --timeout 70 --out "$OUT/many_chains_peers_gpu.json" 2>&1 | tee "$OUT/many_chains_peers.log"
rc2=$?
[ $rc2 -eq 124 ] && echo "gpu.sh: the peers' stage stopped at its 120 s limit; the JSON holds what finished"
# 3. throughput of fixed-step HMC (logistic regression N=1000 D=10), dhmc vs the hand-written floor
timeout 80 python3 -m benchmarks.throughput --gpu --targets logistic --chains "${GPU_CHAINS:-4096,65536}" \
  --draws "${GPU_DRAWS:-200}" --methods "${GPU_METHODS:-dhmc,floor}" --timeout 60 --out "$OUT/throughput_gpu.json" \
  2>&1 | tee "$OUT/gpu.log"
rc3=$?
[ $rc3 -eq 124 ] && echo "gpu.sh: throughput stopped at its 80 s limit; the JSON holds what finished"
# 4. laplace='s price per ensemble gradient, where the Hessian's products run side by side
timeout 45 python3 -m benchmarks.laplace_cost --chains "${GPU_MC_CHAINS:-4096}" --repeats 5 \
  --out "$OUT/laplace_cost_gpu.json" 2>&1 | tee "$OUT/laplace_cost.log"
rc4=$?
[ $rc4 -eq 124 ] && echo "gpu.sh: laplace_cost stopped at its 45 s limit"
exit $(( rc1 > 0 ? rc1 : rc2 > 0 ? rc2 : rc3 > 0 ? rc3 : rc4 ))
