"""`bench run --executor ray`: one sweep spread over the workers of a Ray cluster (one machine or many).

The sweep is cut where its cells are independent:
1. one task computes the dense cells and the calibration statistics of the whole sweep, into the statistics cache
   ($ACBENCH_CACHE, which must be a folder every worker sees: the same path on every node);
2. then every (method, rank ratio, allocation) variant is a task of its own, and the analyses one more; each loads
   the model, reads the statistics from the cache and writes its cells into the results folder (which every worker
   must see too) exactly as the local executor does: atomically, claimed, skipped when already done.

Each task declares its resources (one GPU on CUDA, else CPUs) and sets torch's threads to the CPUs Ray gave it. A
task whose worker dies, or that raises a runtime error, is run again (--retries); a cell it already wrote is kept.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from core.errors import UserError

# Worth another try: a worker killed (out of memory, preempted) or a transient runtime failure (CUDA, I/O). A
# UserError is the input's fault and would fail again.
RETRIED = (RuntimeError, OSError, MemoryError)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise UserError("--executor ray needs Ray, which is not installed: pip install -e '.[ray]' (or run without "
                        "--executor ray)") from None
    return ray


_MODELS: dict = {}  # per worker process: the model its last part loaded (Ray reuses worker processes)


def run_part(fields: dict, parts: tuple, needs: list | None, cache: str, cwd: str) -> dict:
    """One Ray task: `bench.runner.run` on one part of the sweep, in a worker process."""
    import ray

    from analyses import resolve
    from bench.runner import run
    from bench.spec import RunSpec

    os.environ["ACBENCH_CACHE"] = cache  # the driver's cache: the calibration part wrote the statistics there
    if os.path.isdir(cwd):
        os.chdir(cwd)  # relative paths (data files, --output) mean what they meant to the driver
    spec = RunSpec(**fields)
    spec.executor, spec.ray_address, spec.report, spec.progress = "local", None, False, False
    if spec.threads is None:  # `run` sets torch's threads from it
        spec.threads = max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))
    analyses = resolve(spec)
    # A retried task is the same Ray task: it may break the claims its killed attempt left behind.
    owner = f"ray-task:{ray.get_runtime_context().get_task_id()}"
    out = run(spec, analyses, parts=parts, stats_needs=None if needs is None else frozenset(needs), claim_owner=owner,
              models=_MODELS)
    return {"written": out["written"], "elsewhere": len(out["elsewhere"])}


def _short(e: BaseException) -> str:
    cause = getattr(e, "cause", None)
    if cause is not None:
        return f"{type(cause).__name__}: {cause}".splitlines()[0]
    lines = [l for l in str(e).strip().splitlines() if l.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"


def variant_parts(spec) -> list[tuple]:
    """(method, budget, rule, the part's own budget fields) per variant task: a rank and rule per low-rank method,
    a pattern per sparsity one."""
    import methods
    from core.record import UNIFORM
    from core.stats import SPARSITY_FAMILY

    out = []
    for m in spec.methods:
        if methods.family_of(m) == SPARSITY_FAMILY:
            out += [(m, p, UNIFORM, {"ranks": None, "sparsity": [p]}) for p in spec.sparsity or []]
        else:
            out += [(m, r, rule, {"ranks": [r], "sparsity": None}) for r in spec.ranks for rule in spec.allocate]
    return out


def run_on_ray(spec) -> dict:
    """The sweep of `spec` on Ray; returns {"written", "failed": [one line per failed task], "seconds"}."""
    from tqdm.auto import tqdm

    from analyses import resolve
    from bench.runner import sweep_needs
    from bench.spec import validate
    from core.io import cache_dir
    from core.record import variant_name

    ray = _import_ray()
    analyses = resolve(spec)
    validate(spec, set(analyses))  # every input error before a cluster starts
    spec.output = str(Path(spec.output).resolve())
    t0 = time.perf_counter()
    if not ray.is_initialized():
        # A local instance keeps a small object store: statistics travel through the cache folder, not Ray.
        kw = {} if spec.ray_address else {"object_store_memory": 256 * 2**20}
        try:
            ray.init(address=spec.ray_address, include_dashboard=False, log_to_driver=True, **kw)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise UserError(f"cannot join the Ray cluster at {spec.ray_address} ({str(e).splitlines()[0]}): start it "
                            "with `ray start --head` or fix --ray-address") from None
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    node_cpus = max(int(n["Resources"].get("CPU", 0)) for n in nodes)
    total_cpus = int(ray.cluster_resources().get("CPU", 0))
    gpus = int(ray.cluster_resources().get("GPU", 0))
    cuda = spec.device.startswith("cuda")
    if cuda and gpus < 1:
        raise UserError("--device cuda with --executor ray, but the Ray cluster has no GPU: start the workers on GPU "
                        "machines or use --device cpu")
    variants = variant_parts(spec)
    n_tasks = len([t for t in spec.tasks if t not in analyses])
    if cuda:
        cpus = spec.threads or max(1, total_cpus // max(1, gpus))
    else:  # the cluster's CPUs shared out over the variants that run at once, within one node
        cpus = spec.threads or max(1, total_cpus // max(1, len(variants) + bool(analyses)))
    cpus = min(cpus, node_cpus)
    options = {"num_cpus": cpus, "num_gpus": 1 if cuda else 0, "max_retries": spec.retries,
               "retry_exceptions": list(RETRIED)}
    part = ray.remote(run_part)
    fields = spec.as_dict()
    needs = sorted(sweep_needs(spec, analyses))
    common = (needs, str(cache_dir()), os.getcwd())
    print(f"ray: {len(nodes)} node(s), {total_cpus} CPUs, {gpus} GPUs; {len(variants)} variant task(s) with "
          f"{cpus} CPU(s){' and 1 GPU' if cuda else ''} each, after one dense + calibration task", flush=True)

    bar = tqdm(total=n_tasks * (1 + len(variants)) + len(analyses) * len(spec.ranks), desc="cells", unit="cell",
               disable=not spec.progress)
    written, failed = 0, []
    # 1. dense cells and the sweep's statistics (the calibration runs on a GPU when --device cuda)
    prep_opts = dict(options, num_cpus=spec.threads or (node_cpus if not cuda else cpus))
    try:
        out = ray.get(part.options(**prep_opts).remote(fields, ("dense", "calibrate"), *common))
    except Exception as e:  # noqa: BLE001 (Ray wraps the worker's exception)
        cause = getattr(e, "cause", None)
        if isinstance(cause, UserError):
            raise cause from None
        raise UserError(f"the dense and calibration task failed after {spec.retries} retries ({_short(e)}): "
                        "nothing else was started") from None
    written += out["written"]
    bar.update(n_tasks)
    # 2. the variants and the analyses, all at once, as the cluster's resources allow
    refs = {}
    for m, r, rule, budget in variants:
        sub = dict(fields, methods=[m], allocate=[rule], tasks=[t for t in spec.tasks if t not in analyses], **budget)
        label = f"{variant_name(m, rule)} @ {r:g}" if isinstance(r, float) else f"{m} @ {r}"
        refs[part.options(**options).remote(sub, ("variants",), *common)] = (label, n_tasks)
    if analyses:
        refs[part.options(**options).remote(fields, ("analyses",), *common)] = (
            "analyses " + ", ".join(analyses), len(analyses) * len(spec.ranks))
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        label, n = refs[done[0]]
        try:
            out = ray.get(done[0])
            written += out["written"]
        except Exception as e:  # noqa: BLE001 (listed at the end; the other tasks go on)
            failed.append(f"{label}: {_short(e)}")
        bar.update(n)
    bar.close()
    elapsed = time.perf_counter() - t0
    print(f"done: {written} cell(s) written by {len(variants) + 1 + bool(analyses)} Ray task(s) in {elapsed:.0f} s",
          flush=True)
    if failed:
        print(f"{len(failed)} task(s) failed after {spec.retries} retries; their cells are missing (a rerun computes "
              "only those):", flush=True)
        for line in failed:
            print(f"  {line}", flush=True)
    return {"written": written, "failed": failed, "seconds": elapsed}
