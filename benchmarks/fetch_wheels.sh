#!/usr/bin/env bash
# Download the wheels that benchmarks/gpu.sh installs on a lent GPU machine (which cannot reach a package
# registry) into .whl/ at the repository root (git-ignored). Run here, from anywhere; needs pip and PyPI.
#
# The GPU machine's image already has JAX (CUDA), NumPyro, optax, xarray, numpy, pandas, scipy, cloudpickle,
# msgpack, psutil, pyyaml, toolz, click, jinja2, sortedcontainers, fsspec, packaging, prometheus-client,
# matplotlib, numba(-cuda) and nvidia-ml-py (see the device notes); these are the rest dhmc and the
# benchmark need, pinned to the versions tested here, for CPython 3.12 on x86-64 Linux.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
mkdir -p .whl
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
fetch() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d .whl "$@"
}

# dhmc's own needs that the image lacks
fetch dask==2026.8.0 distributed==2026.8.0 tornado==6.6.1 tblib==3.2.2 zict==3.0.0 locket==1.0.0 partd==1.4.2
fetch zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0
# xarray with DataTree (the image's may predate it)
fetch xarray==2026.9.0
# BlackJAX for the side-by-side (pure Python; optax and scipy are in the image)
fetch blackjax==1.7.1
# ArviZ for many_chains.py's ESS and R-hat (pure Python); the image has its other needs (matplotlib, h5py, xarray,
# pandas, scipy, setuptools, typing_extensions)
fetch arviz==0.23.4 xarray-einstats==0.9.1 h5netcdf==1.8.3 platformdirs==4.14.9
# dask-cuda for LocalCUDACluster (optional: gpu.sh falls back to a 1-worker LocalCluster when it does not
# import against this dask). Its rapids-dask-dependency pin is skipped on purpose (--no-deps).
fetch dask-cuda || echo "dask-cuda: no wheel fetched; gpu.sh will use a 1-GPU LocalCluster"

ls -l .whl
du -sh .whl
