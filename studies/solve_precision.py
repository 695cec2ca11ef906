"""float32 against float64 solves on Gemma-3-270m's real statistics (issue 24: the bound behind --solve-dtype).

For every low-rank method at rank 0.5: each group is solved in float64 and in float32 from the same statistics
(the default run's calibration, read from the cache), the input subspaces compared by principal angles (per site:
the row space of B, where a site computes A B x) and by what the angles cost: each site's weight error
||W - A B|| / ||W|| in both precisions (a subspace rotated inside a near-degenerate band at the cut has large
angles and the same error). The model compressed both ways is evaluated on ppl-token as the default run sizes it.
Also the fallbacks each precision recorded and the solve seconds. Run it on a quiet machine:

    .venv/bin/python -m acbench.studies.solve_precision --out solve_precision.json
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch


def principal_angles(B1: torch.Tensor, B2: torch.Tensor) -> torch.Tensor:
    """Angles (radians, ascending) between the row spaces of two k x d matrices."""
    q1 = torch.linalg.qr(B1.double().T)[0]
    q2 = torch.linalg.qr(B2.double().T)[0]
    cos = torch.linalg.svdvals(q1.T @ q2).clamp(-1, 1)
    return torch.arccos(cos)  # svdvals descend, so the angles ascend


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=float, default=0.5)
    ap.add_argument("--methods", nargs="*", default=None, help="default: every low-rank method")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from acbench.studies import output_problem

    problem = output_problem(args.out, "--out") if args.out else None
    if problem:
        ap.error(problem)

    from acbench import methods
    from acbench.deploy.apply import apply_compression, restore
    from acbench.runner.config import RunConfig
    from acbench.runner.resolve import resolve_run
    from acbench.runner.worker import Worker
    from acbench.runner.prepare import prepare

    config = RunConfig(methods=["all"], ranks=[args.rank], tasks=["ppl-token"], progress=False,
                       output="/tmp/acbench-solve-precision")
    run = resolve_run(config)
    p = prepare(run)
    worker = Worker(p.run, p.source, p.calib_windows)
    lm = worker.model()
    worker.statistics(every_group=True)
    rank = p.run.ranks[0]
    task = p.run.tasks["ppl-token"]
    names = args.methods or [m for m in p.run.methods if methods.family_of(m) == methods.LOW_RANK_FAMILY]
    out = {"model": lm.name, "rank": rank.ratio, "threads": torch.get_num_threads(), "methods": {}}
    for name in names:
        comp = methods.build(name)
        row = {}
        spaces, errors = {}, {}
        for dtype in (torch.float64, torch.float32):
            label = str(dtype).removeprefix("torch.")
            undo, fallbacks, seconds = [], [], 0.0
            try:
                for g in worker.groups:
                    t0 = time.perf_counter()
                    res = comp.compress(g, worker.stats[g.name], rank, dtype=dtype)
                    seconds += time.perf_counter() - t0
                    fallbacks += [dict(f, group=g.name) for f in res.fallbacks]
                    modules = dict(zip(g.site_names, g.sites))
                    for site, (A, B) in res.factors.items():
                        W = modules[site].weight.detach().double()
                        spaces.setdefault(f"{g.name}.{site}", {})[label] = B.double()
                        err = float((W - A.double() @ B.double()).norm() / W.norm())
                        errors.setdefault(f"{g.name}.{site}", {})[label] = err
                    undo.append(apply_compression(lm.model, g, res))
                ppl = task.evaluate(lm.model, lm.tokenizer, progress=False).metrics
            finally:
                for u in reversed(undo):
                    restore(lm.model, u)
            row[label] = {"solve_s": round(seconds, 2), "ppl_token": ppl, "n_fallbacks": len(fallbacks),
                          "fallback_kinds": sorted({f"{f['op']}:{f['kind']}" for f in fallbacks})}
        angles = {site: principal_angles(b["float64"], b["float32"]) for site, b in spaces.items()}
        largest = {site: float(a[-1]) for site, a in angles.items()}
        worst = max(largest, key=largest.get)
        every = torch.cat(list(angles.values()))
        row["angles_deg"] = {"max": math.degrees(largest[worst]), "max_at": worst,
                             "median_site_max": math.degrees(float(torch.tensor(list(largest.values())).median())),
                             "mean_all": math.degrees(float(every.mean())), "sites": len(angles)}
        change = {site: abs(e["float32"] - e["float64"]) / max(e["float64"], 1e-30) for site, e in errors.items()}
        shift = {site: abs(e["float32"] - e["float64"]) for site, e in errors.items()}
        row["weight_error"] = {"max_relative_change": max(change.values()), "at": max(change, key=change.get),
                               "max_change": max(shift.values()), "max_change_at": max(shift, key=shift.get),
                               "mean_float64": sum(e["float64"] for e in errors.values()) / len(errors),
                               "mean_float32": sum(e["float32"] for e in errors.values()) / len(errors)}
        out["methods"][name] = row
        print(json.dumps({name: row}), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    from acbench.core.log import console_lines

    with console_lines():  # a script: acbench's lines on its stdout
        main()
