"""The ``dhmc`` command: thin parsing around the public API; user mistakes exit 2 with one line."""

from __future__ import annotations

import argparse
import sys

from dhmc.errors import BlockTimeoutError, NoWorkersError, WorkerCrashError, one_line

__all__ = ["main"]

ERRORS = (ValueError, TypeError, FileExistsError, PermissionError, FileNotFoundError, RuntimeError, OSError)


def _cluster_option(text: str):
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    import yaml

    return key, yaml.safe_load(value)


def _draws(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dhmc", description="Dask-distributed ensemble HMC.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("sample", help="sample a built-in or your own model into a Zarr store")
    s.add_argument("model", help="a built-in model name (see `dhmc models`), or pkg.module:function naming a JAX "
                                 "log density, a NumPyro model, a pymc.Model or bambi.Model or a function returning "
                                 "one (the working directory is importable)")
    s.add_argument("--data", default=None, metavar="FILE",
                   help=".npz or .json: keyword arguments of the model (a log density gets them bound)")
    s.add_argument("--init", default=None, metavar="FILE",
                   help=".npz or .json: one chain's position (a log density: required) or NumPyro site values")
    s.add_argument("--by-reference", action="store_true",
                   help="the workers import MODEL and call it with --data's arguments to make the target (a "
                        "pymc.Model or an object with build()), instead of receiving it pickled")
    s.add_argument("--log-likelihood", action="store_true",
                   help="NumPyro and PyMC models: store the pointwise log-likelihood (for arviz.loo)")
    s.add_argument("--chains", type=int, default=1024)
    s.add_argument("--draws", type=_draws, default=1000, help="draws per chain, or auto: until --target-ess")
    s.add_argument("--target-ess", type=float, default=None, help="with --draws auto: bulk and tail ESS (1000)")
    s.add_argument("--max-draws", type=int, default=None, help="with --draws auto: at most this many (10000)")
    s.add_argument("--warmup", type=_draws, default="auto",
                   help="adaptation iterations, or auto (default): until the ensemble converged")
    s.add_argument("--max-warmup", type=int, default=None, help="with --warmup auto: at most this many (1000)")
    s.add_argument("--thinning", type=int, default=1, help="keep a draw every N transitions")
    s.add_argument("--save-warmup", action="store_true", help="keep the warmup draws (group warmup_posterior)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--chains-per-task", type=int, default=None)
    s.add_argument("--kernel", default="chees", help="chees (default), mams or hmc")
    s.add_argument("--step-size", type=float, default=None)
    s.add_argument("--num-steps", type=int, default=None)
    s.add_argument("--trajectory-length", type=float, default=None)
    s.add_argument("--no-adapt", dest="adapt", action="store_false")
    s.add_argument("--dense-mass", action=argparse.BooleanOptionalAction, default=None,
                   help="a dense (--dense-mass) or diagonal (--no-dense-mass) metric; default: warmup=auto chooses")
    s.add_argument("--target-accept", type=float, default=None, help="default 0.8 (0.9 for mams)")
    s.add_argument("--noncentered", action="store_true",
                   help="NumPyro and PyMC models: hierarchical normal variables sampled non-centred (mu + tau * z)")
    s.add_argument("--laplace", nargs="?", const=True, default=False, metavar="NAMES",
                   help="latent variables (comma-separated; none: a NumPyro or PyMC model's hierarchical ones) sampled "
                        "Laplace-whitened given the rest")
    s.add_argument("--out", required=True, help="Zarr store to write")
    s.add_argument("--overwrite", action="store_true", help="replace an existing store")
    _cluster_args(s)

    r = sub.add_parser("resume", help="continue an interrupted run from its store")
    r.add_argument("store")
    r.add_argument("--model", default=None, metavar="MODULE:FUNCTION",
                   help="the store's own model (pkg.module:function), to confirm that it may be imported and run")
    r.add_argument("--force", action="store_true",
                   help="resume even with another model, data, dhmc or JAX version than the store's run")
    _cluster_args(r)

    e = sub.add_parser("extend", help="add draws to a finished run, bitwise as one longer run")
    e.add_argument("store")
    e.add_argument("--draws", type=int, required=True, help="draws per chain to add")
    e.add_argument("--model", default=None, metavar="MODULE:FUNCTION", help="as for resume")
    e.add_argument("--force", action="store_true", help="as for resume")
    _cluster_args(e)

    m = sub.add_parser("summary", help="diagnostics of a store: means, R-hat, ESS, divergences")
    m.add_argument("store")

    sub.add_parser("models", help="list the built-in models")

    sc = sub.add_parser("scale", help="strong or weak scaling study, or time vs chains on one worker")
    sc.add_argument("kind", choices=["strong", "weak", "chains"])
    sc.add_argument("--workers", default=None, help="comma-separated worker counts (strong/weak: default 1,2)")
    sc.add_argument("--chains", default=None, help="total chains (strong) or a comma-separated list (chains)")
    sc.add_argument("--chains-per-worker", type=int, default=None, help="chains per worker (weak)")
    sc.add_argument("--draws", type=int, default=400)
    sc.add_argument("--model", default="gaussian_2d", help="a built-in model, or several comma-separated")
    sc.add_argument("--chains-per-task", type=int, default=None)
    sc.add_argument("--step-size", type=float, default=None)
    sc.add_argument("--num-steps", type=int, default=None)
    sc.add_argument("--seed", type=int, default=0)
    sc.add_argument("--repeat", type=int, default=3)
    sc.add_argument("--out", required=True, help="folder for scaling.json and the plots")
    _cluster_args(sc, progress=False)
    return p


def _cluster_args(p, progress=True):
    p.add_argument("--cluster", default=None, help="local (default), cuda, slurm or a scheduler address")
    p.add_argument("--cluster-option", action="append", type=_cluster_option, default=[], metavar="KEY=VALUE",
                   help="override an option of dhmc.cluster.<kind> in dask config")
    if progress:  # runs of a user's model (scaling studies run built-in models only)
        p.add_argument("--worker-setup", action="append", default=[], metavar="MODULE_OR_SCRIPT",
                       help="a module to import or a .py script to run on every worker before its first block "
                            "(added to dhmc.worker-setup; repeatable)")
        p.add_argument("--no-progress", dest="progress", action="store_false")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if getattr(args, "worker_setup", None):
        import dask.config

        configured = list(dask.config.get("dhmc.worker-setup", default=None) or [])
        dask.config.set({"dhmc.worker-setup": configured + args.worker_setup})
    try:
        return _COMMANDS[args.command](args)
    except (WorkerCrashError, NoWorkersError, BlockTimeoutError) as e:  # the run cannot go on: the whole message
        print(f"dhmc: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        store = getattr(args, "out", None) or getattr(args, "store", None)
        hint = f"; the store is resumable: dhmc resume {store}" if store and args.command != "scale" else ""
        print(f"dhmc: interrupted{hint}", file=sys.stderr)
        return 130
    except ERRORS as e:
        print(f"dhmc: error: {one_line(e)}", file=sys.stderr)
        return 2


def _sample(args) -> int:
    import dhmc
    from dhmc.models.reference import is_reference, read_inputs

    if (args.data or args.init) and not is_reference(args.model):
        raise ValueError(f"--data and --init need a model given as pkg.module:function, got {args.model!r}")
    data = read_inputs(args.data, "data") if args.data else {}
    init = read_inputs(args.init, "init") if args.init else None
    model = args.model
    if args.by_reference:
        from dhmc.models import by_reference

        if init is not None:
            raise ValueError("--init does not go with --by-reference: the function MODEL names makes the whole target")
        model, data = by_reference(args.model, **data), {}
    trace = dhmc.sample(model, model_kwargs=data, init=init, log_likelihood=args.log_likelihood,
                        thinning=args.thinning, save_warmup=args.save_warmup,
                        chains=args.chains, draws=args.draws, warmup=args.warmup, seed=args.seed,
                        kernel=args.kernel, step_size=args.step_size, num_steps=args.num_steps,
                        trajectory_length=args.trajectory_length, adapt=args.adapt, dense_mass=args.dense_mass,
                        target_accept=args.target_accept, chains_per_task=args.chains_per_task, store=args.out,
                        overwrite=args.overwrite, cluster=args.cluster, cluster_options=dict(args.cluster_option),
                        progress=args.progress, target_ess=args.target_ess, max_draws=args.max_draws,
                        max_warmup=args.max_warmup, noncentered=args.noncentered,
                        laplace=args.laplace.split(",") if isinstance(args.laplace, str) else args.laplace)
    _print_result(trace, args.out)
    return 0


def _resume(args) -> int:
    import dhmc

    trace = dhmc.resume(args.store, cluster=args.cluster, cluster_options=dict(args.cluster_option),
                        progress=args.progress, force=args.force, target=args.model)
    _print_result(trace, args.store)
    return 0


def _extend(args) -> int:
    import dhmc

    trace = dhmc.extend(args.store, args.draws, cluster=args.cluster, cluster_options=dict(args.cluster_option),
                        progress=args.progress, force=args.force, target=args.model)
    _print_result(trace, args.store)
    return 0


def _print_result(trace, store) -> None:
    import json

    timing = json.loads(trace["posterior"].attrs.get("dhmc_timing", "{}"))
    post = trace["posterior"]
    means = ", ".join(f"{k}={v.mean(('chain', 'draw')).values.round(4).tolist()}" for k, v in post.data_vars.items())
    size = f"{post.sizes['chain']} chains x {post.sizes['draw']} draws"
    print(f"wrote {store}: {size} in {timing.get('total', 0):.1f} s; posterior means {means}")


def _summary(args) -> int:
    import pandas as pd

    from dhmc import diagnostics, open_trace
    from dhmc.storage.zarr_ import open_store

    if _say_unfinished_or_damaged(args.store, *open_store(args.store)):  # a missing or broken store: a clear error
        return 1
    trace = open_trace(args.store)
    table = diagnostics.summary(trace)
    with pd.option_context("display.max_rows", 200, "display.width", 160):
        print(table.round(4).to_string())
    print(f"divergences: {diagnostics.divergences(trace)}; E-BFMI: {diagnostics.ebfmi(trace):.3f}")
    for warning in diagnostics.check(trace, table):
        print(f"warning: {warning}")
    return 0


def _say_unfinished_or_damaged(store, root, layout) -> bool:
    """Before a summary: how much of an unfinished run is done, and which done blocks are damaged (True: some are,
    and no summary can be read)."""
    import json

    from dhmc.distributed.spec import RunSpec
    from dhmc.storage import integrity

    geometry = RunSpec(**json.loads(root.attrs["dhmc_run_spec"])).geometry
    integrity.check_arrays(root, layout, geometry, store)
    done, unreadable = integrity.read_done(root, geometry)  # an unreadable flag is damage, said below
    damaged = integrity.damaged_blocks(root, layout, geometry, store)
    if int(done.sum()) + len(unreadable) < done.size:
        print(f"unfinished: {int(done.sum())} of {done.size} blocks done (the rest read as NaN); dhmc resume "
              f"{store} finishes it")
    if damaged:
        print(f"damaged: {integrity.describe(damaged, store)}; dhmc resume {store} runs them again")
    return bool(damaged)


def _models(args) -> int:
    from dhmc.models.examples import DESCRIPTIONS

    for name, text in DESCRIPTIONS.items():
        print(f"{name:22s} {text}")
    return 0


def _scale(args) -> int:
    from dhmc.scaling import run_study

    ints = lambda text: [int(v) for v in str(text).split(",")] if text else None
    chains = ints(args.chains)
    workers = ints(args.workers) or (None if args.kind == "chains" else [1, 2])
    models = args.model.split(",")
    result = run_study(args.kind, workers, chains=chains[0] if chains and args.kind != "chains" else None,
                       chains_per_worker=args.chains_per_worker, draws=args.draws,
                       model=models[0] if len(models) == 1 else models, cluster=args.cluster, repeat=args.repeat,
                       out=args.out, chains_list=chains if args.kind == "chains" else None,
                       chains_per_task=args.chains_per_task, step_size=args.step_size, num_steps=args.num_steps,
                       seed=args.seed, cluster_options=dict(args.cluster_option))
    for run in result["runs"]:
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in run.items()))
    print(f"wrote {args.out}/scaling.json")
    return 0


_COMMANDS = {"sample": _sample, "resume": _resume, "extend": _extend, "summary": _summary, "models": _models,
             "scale": _scale}

if __name__ == "__main__":
    sys.exit(main())
