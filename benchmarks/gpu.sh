#!/usr/bin/env bash
# One prepared script for a lent GPU machine: throughput of fixed-step HMC on the GPU, dhmc vs the
# hand-written vmapped floor vs BlackJAX vs NumPyro (vectorized), logistic regression N=1000 D=10,
# 2^10 .. 2^16 chains. Ends within 8 minutes; results are written after each measurement, so a run cut
# short keeps what it finished.
#
# Here first (the GPU machine cannot reach a registry):   bash benchmarks/fetch_wheels.sh   (fills .whl/)
# Then, from the repository root on the GPU machine (device tool: carry ".whl"):   bash benchmarks/gpu.sh
#
# dhmc runs on dask-cuda's LocalCUDACluster (cluster="cuda") when dask_cuda imports, else on a 1-worker
# distributed.LocalCluster (one GPU), with the whole ensemble in one block (chains_per_task = chains).
# Output: $OUT (or benchmarks/results/gpu/): throughput_gpu.json, gpu.log, nvidia-smi.txt.
set -u
cd "$(dirname "$(readlink -f "$0")")/.."
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "installing the carried wheels failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
{
  nvidia-smi || true
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())" || true
  python3 -c "import dask_cuda; print('dask_cuda', dask_cuda.__version__)" || echo "no dask_cuda: 1-GPU LocalCluster"
  python3 -c "import dask, distributed, zarr, numpyro; print('dask', dask.__version__, 'zarr', zarr.__version__, 'numpyro', numpyro.__version__)"
} >"$OUT/nvidia-smi.txt" 2>&1
cat "$OUT/nvidia-smi.txt"
python3 -c "import jax, sys; sys.exit(0 if jax.default_backend() == 'gpu' else 'gpu.sh: JAX sees no GPU: install its CUDA build (deploy/README.md: pip install -U \"jax[cuda12]\")')" \
  || exit 1

CHAINS=${GPU_CHAINS:-1024,4096,16384,65536}
METHODS=${GPU_METHODS:-dhmc,floor,blackjax,numpyro}
set -o pipefail
timeout 450 python3 benchmarks/throughput.py --gpu --targets logistic --chains "$CHAINS" --draws "${GPU_DRAWS:-200}" \
  --methods "$METHODS" --timeout 150 --out "$OUT/throughput_gpu.json" 2>&1 | tee "$OUT/gpu.log"
rc=$?
[ $rc -eq 124 ] && echo "gpu.sh: stopped at its 450 s limit; $OUT/throughput_gpu.json holds what finished"
exit $rc
