"""One Llama-3-8B-shaped group solved on a GPU in float64 and float32, against the host (benchmarks/gpu_check.sh).

The group is mlp_out's shape (d = 14,336 inputs, one 4,096 x 14,336 site): its weight and statistics are random
with a decaying spectrum (C = A A^T / d and F = G G^T / d, A and G Gaussian with column scales 1/sqrt(1 + j/64)),
drawn on the CPU from a seed. Each method in --methods is solved on --device in float64 and in float32 through the
Compressor API (as a run solves it), timed, and compared: principal angles between the kept input subspaces and
the weight error ||W - A B|| / ||W|| in each precision. The methods in --host are solved on the host in float64 too
and compared with the device's float64 solve (pca by default: one eigh at d = 14,336, a minute or two on 16
cores). Prints one JSON line per result; --out writes them all.

    .venv/bin/python -m acbench.studies.solve_8b_group --device cuda --out solve_8b_group.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch



def principal_angles(B1: torch.Tensor, B2: torch.Tensor) -> torch.Tensor:
    q1 = torch.linalg.qr(B1.double().T)[0]
    q2 = torch.linalg.qr(B2.double().T)[0]
    return torch.arccos(torch.linalg.svdvals(q1.T @ q2).clamp(-1, 1))


def random_group(d: int, d_out: int, n_pairs: int, seed: int, device: str = "cpu"):
    from acbench.model.groups import InputGroup
    from acbench.core.stats import GroupStats

    gen = torch.Generator().manual_seed(seed)
    scales = (1 + torch.arange(d, dtype=torch.float64) / 64).rsqrt()

    def moment():  # the d^3 product on `device` (seconds on a GPU, a minute on the host), kept on the host
        A = (torch.randn(d, d, generator=gen, dtype=torch.float32) * scales.float()).to(device, torch.float64)
        return ((A @ A.T) / d).cpu()

    C, F = moment(), moment()
    site = torch.nn.Linear(d, d_out, bias=False)
    with torch.no_grad():
        site.weight.copy_(torch.randn(d_out, d, generator=gen) / math.sqrt(d))
    xs = torch.randn(n_pairs, d, generator=gen) * scales.float()
    gs = torch.randn(n_pairs, d, generator=gen) * scales.float()
    group = InputGroup("layers.0.mlp_out", 0, "mlp_out", ("model.layers.0.mlp.down_proj",), (site,))
    stats = GroupStats(n_tokens=4096, C=C, F=F, abs_mean=xs.abs().mean(0).double(), mean=xs.mean(0).double(),
                       xs=xs, gs=gs)
    return group, stats


def solve(method: str, group, stats, device: str, dtype: torch.dtype, rank: float):
    from acbench import methods
    from acbench.core.stats import RankSpec

    stats.memo.clear()  # each timing solves from scratch, bases included
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    res = methods.build(method).compress(group, stats, RankSpec(rank), device=device, dtype=dtype)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    ((_, (A, B)),) = res.factors.items()
    W = group.sites[0].weight.detach().double()
    err = float((W - A.double().cpu() @ B.double().cpu()).norm() / W.norm())
    return {"seconds": round(seconds, 2), "weight_error": err, "fallbacks": res.fallbacks}, B.double().cpu()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--methods", nargs="*", default=["pca", "fasc-kfac", "whitened-svd"])
    ap.add_argument("--host", nargs="*", default=["pca"], help="methods also solved on the host in float64")
    ap.add_argument("--d", type=int, default=14336)
    ap.add_argument("--d-out", type=int, default=4096)
    ap.add_argument("--rank", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from acbench.studies import output_problem

    problem = output_problem(args.out, "--out") if args.out else None
    if problem:
        ap.error(problem)
    t0 = time.perf_counter()
    group, stats = random_group(args.d, args.d_out, 512, args.seed, args.device)
    results = [{"d": args.d, "d_out": args.d_out, "rank": args.rank, "device": args.device,
                "build_s": round(time.perf_counter() - t0, 1)}]
    print(json.dumps(results[0]), flush=True)
    for method in args.methods:
        row, B64 = solve(method, group, stats, args.device, torch.float64, args.rank)
        row32, B32 = solve(method, group, stats, args.device, torch.float32, args.rank)
        angles = principal_angles(B64, B32)
        out = {"method": method, "float64": row, "float32": row32,
               "angle_deg_max": math.degrees(float(angles.max())), "angle_deg_median": math.degrees(float(angles.median()))}
        if method in args.host:
            host, Bh = solve(method, group, stats, "cpu", torch.float64, args.rank)
            out["host_float64"] = host
            out["host_vs_device_angle_deg_max"] = math.degrees(float(principal_angles(Bh, B64).max()))
        results.append(out)
        print(json.dumps(out), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    from acbench.core.log import console_lines

    with console_lines():  # a script: acbench's lines on its stdout
        main()
