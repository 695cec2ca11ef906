"""Calibration of a Llama-3-8B-shaped model in bounded memory (issue: run the paper's models).

Builds a random-weight model from the Llama-3-8B layer shapes with 2 blocks and a 32k vocabulary (about 0.75B
parameters, no download), calibrates the statistics fasc-kfac needs (C and F, 4.1 GB per block in float64) with
or without --stats-memory, then reads every group back through the StatsStore as compression does. Run it under
/usr/bin/time -v, once per budget, on a quiet machine:

    /usr/bin/time -v .venv/bin/python -m acbench.studies.large_model_memory --stats-memory 4GB
    /usr/bin/time -v .venv/bin/python -m acbench.studies.large_model_memory
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

CONFIG = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "configs" / "llama-3-8b" / "config.json"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stats-memory", default=None)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    args = ap.parse_args()
    os.environ.setdefault("ACBENCH_CACHE", tempfile.mkdtemp(prefix="acbench-large-"))
    from transformers import AutoModelForCausalLM, LlamaConfig

    from acbench.model.groups import find_input_groups
    from acbench.model.sources import LoadedModel
    from acbench.calibration.engine import CalibSpec
    from acbench.calibration.cache import load_or_calibrate
    from acbench.core.units import parse_bytes
    from acbench.calibration.group_files import nbytes

    cfg = LlamaConfig(**{**json.loads(CONFIG.read_text()), "num_hidden_layers": 2, "vocab_size": 32000})
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    n_params = sum(p.numel() for p in model.parameters())
    build_s = time.perf_counter() - t0
    lm = LoadedModel(model, None, {"source": "random", "config": "llama-3-8b, 2 blocks, 32k vocab"}, "llama3-8b-2l")
    windows = torch.randint(0, cfg.vocab_size, (args.windows, args.seq_len), generator=torch.Generator().manual_seed(0))
    cspec = CalibSpec(samples=args.windows, seq_len=args.seq_len, bos="none")
    groups = find_input_groups(model)
    t0 = time.perf_counter()
    store, info = load_or_calibrate(lm, groups, cspec, frozenset({"C", "F"}),
                                    parse_bytes(args.stats_memory) if args.stats_memory else None, batch_size=2,
                                    progress=False, windows=windows)
    calib_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    total = sum(nbytes(store[g.name]) for g in groups)  # every group read back, as compression reads them
    read_s = time.perf_counter() - t0
    print(json.dumps({"params": n_params, "weight_bytes": n_params * 4, "stats_memory": args.stats_memory,
                      "passes": info["passes"], "stats_bytes_total": total, "held_bytes_after": store.held_bytes,
                      "build_s": round(build_s, 1), "calibrate_s": round(calib_s, 1), "read_back_s": round(read_s, 1)}))


if __name__ == "__main__":
    from acbench.core.log import console_lines

    with console_lines():  # a script: acbench's lines on its stdout
        main()
