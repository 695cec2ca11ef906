"""`bench plan`: what a run costs (statistics, calibration passes, memory), from the model's config alone."""

from __future__ import annotations

from bench.costs import CostEstimate, estimate_costs
from bench.models import DEFAULT_MODEL
from core.units import human, parse_bytes


def add_plan_parser(sub):
    p = sub.add_parser("plan", help="what a run costs (statistics, passes, memory), from the model's config alone")
    p.add_argument("--model", default=DEFAULT_MODEL, help="alias, .gguf, checkpoint folder or config.json, hub id")
    p.add_argument("--methods", nargs="+", default=["all"])
    p.add_argument("--rank", nargs="+", default=["0.5"])
    p.add_argument("--budget", choices=["rank", "params"], default="rank")
    p.add_argument("--sparsity", nargs="+", default=None, help="N:M patterns or densities for sparsity methods")
    p.add_argument("--rank-align", type=int, default=1)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--stats-memory", default=None, help="statistics memory per calibration pass, e.g. 16GB")
    p.add_argument("--calib-samples", type=int, default=12)
    p.add_argument("--calib-seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=2, help="calibration windows per forward")
    p.add_argument("--pair-tokens", type=int, default=512)


def cmd_plan(args) -> int:
    import methods

    from bench.config import check_ranks, parse_sparsity

    from .run import split_list

    sparsity = split_list(args.sparsity, str, "--sparsity") if args.sparsity else []
    parse_sparsity(sparsity)
    # `all` means what `bench run` means by it: the families whose budget is given (--rank by default)
    families = [methods.LOW_RANK_FAMILY] + ([methods.SPARSITY_FAMILY] if sparsity else [])
    names = methods.expand_methods(args.methods, families)
    ranks = split_list(args.rank, float, "--rank")
    check_ranks(ranks)
    est = estimate_costs(args.model, names, ranks, args.budget, args.rank_align, args.dtype,
                         parse_bytes(args.stats_memory) if args.stats_memory else None, args.calib_samples,
                         args.calib_seq_len, args.batch_size, args.pair_tokens, sparsity=sparsity)
    print(render(est))
    return 0


def render(plan: CostEstimate) -> str:
    from tabulate import tabulate

    c = plan.config
    lines = [f"model {plan.model}: {c['model_type']}, {plan.n_blocks} blocks, hidden {c['hidden_size']}, "
             f"intermediate {c['intermediate_size']}, vocabulary {c['vocab_size']}; {plan.params / 1e9:.2f}B "
             f"parameters, weights {human(plan.weight_bytes)}", ""]
    stat_names = sorted(plan.stats_total)
    rows = [[k["kind"], k["count"], k["d_in"], "+".join(map(str, k["d_outs"]))] + [human(k["stats"][s]) for s in stat_names]
            for k in plan.kinds]
    rows.append(["total", sum(k["count"] for k in plan.kinds), "", ""] + [human(plan.stats_total[s]) for s in stat_names])
    lines += ["Input groups and the statistics the chosen methods need (float64 moments, float32 token pairs):", "",
              tabulate(rows, headers=["group", "n", "d_in", "d_out"] + stat_names, tablefmt="github",
                       disable_numparse=True), ""]
    body = []
    for name, per_rank in plan.methods.items():
        for r, v in per_rank.items():
            body.append([name, f"{r:g}"] + [f"{'/'.join(map(str, dict.fromkeys(pk['k'])))} {pk['form'][0]}"
                                             for pk in v["per_kind"].values()] + [f"{v['param_ratio']:.3f}"])
    kinds = [k["kind"] for k in plan.kinds]
    if body:
        lines += ["k per group kind (f = factorised, m = merged) and the linear layers' deployed parameter ratio:", "",
                  tabulate(body, headers=["method", "rank"] + kinds + ["param ratio"], tablefmt="github",
                           disable_numparse=True), ""]
    sparse = [[name, label, f"{v['param_ratio']:.3f}", f"{v['compute_ratio']:.3f}",
               "" if v["index_bits_per_token"] is None else v["index_bits_per_token"]]
              for name, per in plan.sparse.items() for label, v in per.items()]
    if sparse:
        lines += ["sparsity methods: deployed parameter ratio, theoretical compute ratio and, for activation "
                  "masks, the index bits per token of one block's group inputs:", "",
                  tabulate(sparse, headers=["method", "sparsity", "param ratio", "compute ratio", "index bits/token"],
                           tablefmt="github", disable_numparse=True), ""]
    total_stats = sum(plan.stats_total.values())
    lines += [f"statistics in memory: {human(total_stats)} in all, {human(plan.stats_per_block)} per block; "
              f"{plan.passes} calibration pass(es), the largest holding {human(plan.pass_bytes)}",
              f"statistics cache on disk (float32): {human(plan.cache_bytes)}",
              f"estimated peak memory, calibration: {human(plan.calibration_peak)} (weights + one pass's statistics "
              f"+ the largest group's float32 products and cache copy + {human(plan.activation_bytes)} of "
              "activations, logits and their gradients)",
              f"estimated peak memory, evaluation: {human(plan.evaluation_peak)} (weights + the largest variant's "
              "factors, in place, + one batch of logits)"]
    return "\n".join(lines)
