"""Run every benchmark, one after the other, writing ``benchmarks/results/*.json``.

    python -m benchmarks.run --quick        # tiny sizes: a smoke run of everything (results/quick/)
    python -m benchmarks.run                # full sizes (long: tens of minutes on 2 cores)
    python -m benchmarks.run --only throughput,ess --out-dir /tmp/results

Benchmarks run one at a time (never two heavy things at once); each measurement inside them runs in
its own process. The exit status is non-zero when any benchmark failed; the others still run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import REPO, RESULTS

BENCHMARKS = {
    # name (module benchmarks.<name>): (extra arguments at full size, extra arguments with --quick)
    "throughput": ([], ["--quick"]),
    "ess": ([], ["--quick"]),
    "memory": ([], ["--quick"]),
    "coin_toss_headline": ([], ["--quick"]),
    "dhmc_overhead": ([], ["--quick"]),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes for every benchmark")
    ap.add_argument("--only", default=",".join(BENCHMARKS), help=f"comma-separated subset of {list(BENCHMARKS)}")
    ap.add_argument("--out-dir", default=None,
                    help="where the JSON files go (default results/, or results/quick/ with --quick)")
    args = ap.parse_args(argv)
    if args.out_dir is None:
        args.out_dir = str(RESULTS / ("quick" if args.quick else ""))
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    status = {}
    for name in names:
        full, quick = BENCHMARKS[name]
        cmd = [sys.executable, "-m", f"benchmarks.{name}", *(quick if args.quick else full),
               "--out", str(out_dir.resolve() / f"{name}.json")]
        print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
        t = time.perf_counter()
        rc = subprocess.call(cmd, cwd=REPO)
        status[name] = (rc, time.perf_counter() - t)
    print("\n=== summary")
    for name, (rc, seconds) in status.items():
        print(f"{name:>20s}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {seconds:.0f} s")
    return 0 if all(rc == 0 for rc, _ in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
