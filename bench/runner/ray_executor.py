"""`bench run --executor ray`: one sweep spread over the workers of a Ray cluster (one machine or many).

The driver prepares the run as the local executor does (model opened without weights, data checked, cells
planned), then hands the same `Cell`s to Ray tasks, cut where they are independent:
1. one task computes the dense cells and the calibration statistics of the whole sweep, into the statistics cache
   ($ACBENCH_CACHE, which must be a folder every worker sees: the same path on every node);
2. then the cells of every (method, budget, allocation) variant are a task of their own, and the analyses' cells
   one more; each worker loads the model, reads the statistics from the cache and writes its cells into the
   results folder (which every worker must see too) exactly as the local executor does: atomically, claimed,
   skipped when already done. Workers receive the resolved Run: nothing is validated twice.

Each task declares its resources (one GPU on CUDA, else CPUs) and sets torch's threads to the CPUs Ray gave it. A
task whose worker dies, or that raises a runtime error, is run again (--retries); a cell it already wrote is kept.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from acbench.core.errors import UserError
from acbench.core.log import console_lines, say

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


_MODELS: dict = {}  # per worker process: the model its last share loaded (Ray reuses worker processes)


def compute_share(run, cells: list, calibrate: bool, cache: str, stats_cache: str, cwd: str) -> dict:
    """One Ray task: a Worker on its share of the planned cells, in a worker process."""
    import ray
    import torch

    from acbench.calibration.engine import allocator_tuning
    from acbench.runner.worker import Worker

    os.environ["ACBENCH_CACHE"] = cache  # the driver's cache: the calibration task wrote the statistics there
    os.environ["ACBENCH_STATS_CACHE"] = stats_cache
    if os.path.isdir(cwd):
        os.chdir(cwd)  # relative paths (data files) mean what they meant to the driver
    cpus = run.config.threads or max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))
    torch.set_num_threads(cpus)
    torch.manual_seed(run.config.seed)
    # A retried task is the same Ray task: it may break the claims its killed attempt left behind.
    worker = Worker(run, models=_MODELS, claim_owner=f"ray-task:{ray.get_runtime_context().get_task_id()}")
    # a worker process the CLI started: its lines on its stdout (Ray forwards them), its allocator tuned as the CLI's
    with console_lines(only_if_unheard=True), allocator_tuning():
        written = worker.compute(cells, calibrate=calibrate)
    return {"written": written, "elsewhere": len(worker.elsewhere)}


def _short(e: BaseException) -> str:
    cause = getattr(e, "cause", None)
    if cause is not None:
        return f"{type(cause).__name__}: {cause}".splitlines()[0]
    lines = [l for l in str(e).strip().splitlines() if l.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"


def shares(cells: list) -> tuple[list, list[tuple[str, list]]]:
    """The dense cells (the first task's), and (label, cells) of every later task: one per variant, one for the
    analyses."""
    from acbench.core.record import DENSE

    dense = [c for c in cells if c.id.method == DENSE]
    later: dict = {}
    for c in cells:
        if c.id.method != DENSE:
            later.setdefault("analyses" if c.id.is_analysis else c.variant, (c.label, []))[1].append(c)
    return dense, [(("analyses " + ", ".join(sorted({c.id.task for c in cs}))) if key == "analyses" else label, cs)
                   for key, (label, cs) in later.items()]


def probe_ray_address(address: str | None, timeout: float) -> None:
    """A HOST:PORT that nothing listens on is said within `timeout` seconds (ray.init itself retries for minutes)."""
    import socket

    from acbench.runner.run_checks import ray_host_port

    target = ray_host_port(address) if address else None
    if target is None:
        return  # a local instance, or the address Ray finds itself (it fails fast when there is none)
    try:
        socket.create_connection(target, timeout=timeout).close()
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise UserError(f"cannot reach the Ray cluster at {address} ({why} after at most {timeout:g} s): start it "
                        "with `ray start --head`, fix --ray-address, or raise --ray-timeout") from None


def _start_ray(ray, config) -> None:
    if ray.is_initialized():
        return
    probe_ray_address(config.ray_address, config.ray_timeout)
    # A local instance keeps a small object store: statistics travel through the cache folder, not Ray.
    kw = {} if config.ray_address else {"object_store_memory": 256 * 2**20}
    try:
        ray.init(address=config.ray_address, include_dashboard=False, log_to_driver=True, **kw)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise UserError(f"cannot join the Ray cluster at {config.ray_address} ({str(e).splitlines()[0]}): start it "
                        "with `ray start --head` or fix --ray-address") from None


def _task_options(ray, config, n_tasks: int) -> tuple[dict, dict]:
    """Resources of the later tasks and of the first (dense and calibration) task."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    node_cpus = max(int(n["Resources"].get("CPU", 0)) for n in nodes)
    total_cpus = int(ray.cluster_resources().get("CPU", 0))
    gpus = int(ray.cluster_resources().get("GPU", 0))
    cuda = config.device.startswith("cuda")
    if cuda and gpus < 1:
        raise UserError("--device cuda with --executor ray, but the Ray cluster has no GPU: start the workers on GPU "
                        "machines or use --device cpu")
    if cuda:
        cpus = config.threads or max(1, total_cpus // max(1, gpus))
    else:  # the cluster's CPUs shared out over the tasks that run at once, within one node
        cpus = config.threads or max(1, total_cpus // max(1, n_tasks))
    cpus = min(cpus, node_cpus)
    options = {"num_cpus": cpus, "num_gpus": 1 if cuda else 0, "max_retries": config.retries,
               "retry_exceptions": list(RETRIED)}
    say(f"ray: {len(nodes)} node(s), {total_cpus} CPUs, {gpus} GPUs; {n_tasks} task(s) with {cpus} CPU(s)"
          f"{' and 1 GPU' if cuda else ''} each, after one dense + calibration task")
    return options, dict(options, num_cpus=config.threads or (node_cpus if not cuda else cpus))


def _first_tasks(ray, part, prep_opts, firsts: list, common) -> int:
    """Every model's dense and calibration task, started together; a failure in any stops the sweep before any
    later task starts."""
    refs = [(run, part.options(**prep_opts).remote(run, dense, True, *common)) for run, dense in firsts]
    written = 0
    for run, ref in refs:
        try:
            written += ray.get(ref)["written"]
        except Exception as e:  # noqa: BLE001 (Ray wraps the worker's exception)
            cause = getattr(e, "cause", None)
            if isinstance(cause, UserError):
                raise cause from None
            raise UserError(f"the dense and calibration task of {run.config.model} failed after "
                            f"{run.config.retries} retries ({_short(e)}): no later task was started") from None
    return written


def run_on_ray(runs) -> dict:
    """The sweep of one run, or of several (one per model: models x variants spread over the workers together),
    on Ray; returns {"written", "failed": [one line per failed task], "seconds"}."""
    from dataclasses import replace

    from tqdm.auto import tqdm

    from acbench.runner.execute import prepare_models
    from acbench.core.io import cache_dir, stats_cache_dir

    runs = list(runs) if isinstance(runs, (list, tuple)) else [runs]
    ray = _import_ray()
    t0 = time.perf_counter()
    plans = []
    for prepared in prepare_models(runs):  # every input error, and the plan, before a cluster starts
        # workers get the resolved run (no progress bars) and cells whose paths mean the same on every node
        run = replace(prepared.run, config=replace(prepared.run.config, progress=False))
        cells = [replace(c, path=Path(c.path).resolve()) for c in prepared.cells]
        dense, later = shares(cells)
        if len(runs) > 1:
            later = [(f"{run.config.model}: {label}", cs) for label, cs in later]
        plans.append((run, cells, dense, later))
    config = runs[0].config
    later = [item for *_, per in plans for item in per]
    _start_ray(ray, config)
    options, prep_opts = _task_options(ray, config, len(later))
    part = ray.remote(compute_share)
    common = (str(cache_dir()), str(stats_cache_dir()), os.getcwd())
    bar = tqdm(total=sum(len(p[1]) for p in plans), desc="cells", unit="cell", disable=not config.progress)
    written = _first_tasks(ray, part, prep_opts, [(run, dense) for run, _, dense, _ in plans], common)
    bar.update(sum(len(p[2]) for p in plans))
    refs = {part.options(**options).remote(run, cs, False, *common): (label, len(cs))
            for run, _, _, per in plans for label, cs in per}
    failed, pending = [], list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        label, n = refs[done[0]]
        try:
            written += ray.get(done[0])["written"]
        except Exception as e:  # noqa: BLE001 (listed at the end; the other tasks go on)
            failed.append(f"{label}: {_short(e)}")
        bar.update(n)
    bar.close()
    elapsed = time.perf_counter() - t0
    say(f"done: {written} cell(s) written by {len(later) + len(plans)} Ray task(s) in {elapsed:.0f} s")
    if failed:
        say(f"{len(failed)} task(s) failed after {config.retries} retries; their cells are missing (a rerun "
              "computes only those):")
        for line in failed:
            say(f"  {line}")
    return {"written": written, "failed": failed, "seconds": elapsed}
