#!/usr/bin/env bash
# Run the dhmc driver as a Slurm job. The driver holds the Dask scheduler and submits the worker
# jobs itself (dask-jobqueue's SLURMCluster, settings from dask config key dhmc.cluster.slurm),
# so it needs only one core and a little memory, but must be allowed to call sbatch from a
# compute node and to run for as long as the whole sampling run.
#
#   sbatch deploy/sbatch-driver.sh MODEL STORE [more `dhmc sample` options]
#   sbatch deploy/sbatch-driver.sh eight_schools /scratch/$USER/eight.zarr --chains 4096 --draws 2000
#   sbatch deploy/sbatch-driver.sh mypkg.models:model /scratch/$USER/run.zarr --data data.npz   # your model,
#     imported from the submission folder (sbatch's working directory); its data is kept in the store
#
# If the job is killed (walltime, preemption), `dhmc resume STORE` (with `--model MODEL` for your own
# model: a store never imports the module it names unasked), run the same way, continues from the
# blocks already in the store.
#
#SBATCH --job-name=dhmc-driver
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --mem=4G
#SBATCH --time=12:00:00
#SBATCH --output=dhmc-driver-%j.out
## Site-specific: the partition the driver itself runs on (a CPU one) and your account.
##SBATCH --partition=cpu
##SBATCH --account=myproject
set -euo pipefail

MODEL=${1:?usage: sbatch sbatch-driver.sh MODEL STORE [dhmc sample options]}
STORE=${2:?usage: sbatch sbatch-driver.sh MODEL STORE [dhmc sample options]}
shift 2

# The environment dhmc is installed in; the worker jobs use the same Python (same path on all nodes).
# source /path/to/venv/bin/activate     # or: module load python; conda activate dhmc

# Worker-job settings (partition, GPUs, memory, walltime, network interface) come from dask config,
# e.g. deploy/dhmc-gpu-partition.yaml copied to ~/.config/dask/. Workers on other nodes must reach
# this node, so the scheduler listens on the cluster network, not loopback (set in that file).
# The driver's own JAX runs no sampling work; keep it off any GPU.
export JAX_PLATFORMS=cpu

echo "dhmc driver on $(hostname) (job ${SLURM_JOB_ID:-?}): model $MODEL -> $STORE"
exec dhmc sample "$MODEL" --cluster slurm --out "$STORE" "$@"
