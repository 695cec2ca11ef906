"""The Python API leaves the caller's process as it found it: in a fresh interpreter, load_model / compress /
evaluate / restore / sweep on the tiny model change neither torch's thread count nor torch's, numpy's or Python's
global random state, neither os.environ nor the working directory, nor transformers' progress bars and log
handler; a sweep writes its cells under the `output` it is given."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = r'''
import json, os, random, sys
import numpy as np, torch
from transformers.utils import logging as hf_logging

def state():
    root = hf_logging._get_library_root_logger()
    return {"threads": torch.get_num_threads(), "torch": torch.get_rng_state().sum().item(),
            "torch_next": None, "numpy": int(np.random.get_state()[1].sum()), "python": hash(random.getstate()),
            "env": dict(os.environ), "cwd": os.getcwd(), "bars": hf_logging.is_progress_bar_enabled(),
            "handler": hf_logging._default_handler in root.handlers}

torch.set_num_threads(1); torch.manual_seed(123); np.random.seed(7); random.seed(9)
hf_logging.disable_default_handler()  # a caller's own logging choice
before = state()
import acbench
lm = acbench.load_model(sys.argv[1], progress=False)
c = acbench.compress(lm, "pca", rank=0.5, calibration="wiki", calib_samples=2, calib_seq_len=32, progress=False)
acbench.evaluate(c.model, lm.tokenizer, tasks=["ppl-token"], ppl_windows=1, ppl_seq_len=16, progress=False)
c.restore()
acbench.sweep(model=sys.argv[1], methods=["pca"], rank=[0.5], tasks=["ppl-token"], ppl_windows=1, ppl_seq_len=16,
            calib_samples=2, calib_seq_len=32, measure_latency=False, output=sys.argv[2], progress=False,
            report=False)
after = state()
print(json.dumps({k: [before[k], after[k]] for k in before if before[k] != after[k]}))
'''


def test_the_api_leaves_the_callers_process_as_it_found_it(tiny, tmp_path):
    out = tmp_path / "results"
    env = {**os.environ, "ACBENCH_CACHE": str(tmp_path / "cache"), "ACBENCH_STATS_CACHE": str(tmp_path / "stats")}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny), str(out)], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-1500:]
    changed = json.loads(r.stdout.strip().splitlines()[-1])
    assert changed == {}, changed
    assert list(out.rglob("ppl-token-*.json"))  # the sweep wrote where it was told
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() and out not in p.parents)
    assert written == [], written  # and nothing else: no statistics cache, no parsed data, nothing in the cwd
    assert not list(Path(tmp_path).glob("results*")) or (tmp_path / "results") == out  # nothing in the cwd besides
