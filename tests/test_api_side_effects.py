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
c = acbench.compress(lm, "pca", rank=0.5, calib_source="wiki", calib_samples=2, calib_seq_len=32, progress=False)
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


SHARED_STATE_SCRIPT = r'''
import ctypes, json, logging, os, sys

# every mallopt call of the process, whoever makes it (acbench reaches glibc through ctypes.CDLL)
calls = []
class RecordingCDLL(ctypes.CDLL):
    def __getattr__(self, name):
        fn = super().__getattr__(name)
        if name != "mallopt":
            return fn
        def mallopt(*args):
            calls.append(args)
            return fn(*args)
        mallopt.argtypes = None
        return mallopt
ctypes.CDLL = RecordingCDLL

import datasets.config, huggingface_hub.constants
received = []
class Keep(logging.Handler):
    def emit(self, record):
        received.append((record.name, record.levelname, record.getMessage()))
logging.getLogger().addHandler(Keep())  # the caller's own root handler

def flags():
    return {"env": {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")},
            "hub": huggingface_hub.constants.HF_HUB_OFFLINE, "datasets": datasets.config.HF_DATASETS_OFFLINE}

import acbench
before = flags()
try:
    acbench.load_model("no-such-org/no-such-model", progress=False)  # the probe fails: 127.0.0.1:9
    refused = None
except acbench.UserError as e:
    refused = str(e)
lm = acbench.load_model(sys.argv[1], progress=False)
lm.model.train()
lm.model.model.layers[0].eval()  # a caller's own mix of modes
modes = [m.training for m in lm.model.modules()]
c = acbench.compress(lm, "fasc-kfac", rank=0.5, calib_source="wiki", calib_samples=2, calib_seq_len=32,
                     progress=False)
deployed_training = lm.model.training
c.restore()
print(json.dumps({"refused": refused, "flags": [before, flags()], "mallopt": calls,
                  "modes_back": [m.training for m in lm.model.modules()] == modes, "deployed_training": deployed_training,
                  "warnings": [r for r in received if r[0].startswith("acbench") and r[1] == "WARNING"],
                  "handlers": [type(h).__name__ for h in logging.getLogger("acbench").handlers],
                  "propagate": logging.getLogger("acbench").propagate}))
'''


def test_a_gradient_method_and_a_failing_hub_leave_shared_state_as_found(tiny, tmp_path):
    """fasc-kfac (a gradient calibration) after a failing hub probe, in a fresh interpreter: glibc's allocator is
    not tuned by a library call (no mallopt), the hub libraries' offline flags are back as they were, a caller's root
    handler receives acbench's warnings (the logger holds only a NullHandler and propagates), and the model's
    training flags are back after restore()."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update({"ACBENCH_CACHE": str(tmp_path / "cache"), "ACBENCH_STATS_CACHE": str(tmp_path / "stats"),
                "HF_ENDPOINT": "http://127.0.0.1:9"})  # the discard port: nothing listens
    r = subprocess.run([sys.executable, "-c", SHARED_STATE_SCRIPT, str(tiny)], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["refused"] and "127.0.0.1 cannot be reached" in got["refused"]
    before, after = got["flags"]
    assert before == after == {"env": {"HF_HUB_OFFLINE": None, "HF_DATASETS_OFFLINE": None}, "hub": False,
                               "datasets": False}
    assert got["mallopt"] == []
    assert got["warnings"], "the short calibration's warnings reach the caller's root handler"
    assert got["handlers"] == ["NullHandler"] and got["propagate"] is True
    assert got["deployed_training"] is False and got["modes_back"] is True
    # the caller's handler received them: nothing of acbench's written on stdout besides the script's own line
    assert [line for line in r.stdout.splitlines() if line.strip()][:-1] == []


def test_the_cli_tunes_the_allocator_around_a_gradient_calibration_only_as_the_application(monkeypatch):
    """The CLI is the application: within its commands a gradient calibration may tune glibc (allocator_tuning)
    and the lines go to stdout; outside them, nothing is left switched on."""
    import logging

    from acbench.calibration import engine
    from acbench.cli import main

    seen = []
    monkeypatch.setattr("acbench.cli.cmd_ls", lambda args: seen.append(
        (bool(engine._ALLOCATOR_TUNED), [type(h).__name__ for h in logging.getLogger("acbench").handlers])) or 0)
    assert main(["ls", "methods"]) == 0
    assert seen == [(True, ["NullHandler", "_AboveTheBars"])]
    assert engine._ALLOCATOR_TUNED == [] and [type(h).__name__ for h in logging.getLogger("acbench").handlers] == [
        "NullHandler"]
