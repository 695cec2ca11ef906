"""acbench as a library: the calls the CLI is a layer over, for notebooks and scripts.

    import acbench
    lm = acbench.load_model("smollm2-135m")
    with acbench.compress(lm, "fasc-kfac", rank=0.5, calib_source=my_texts) as c:
        scores = acbench.evaluate(c, tasks=["lama", "ppl-token"])
        c.save("smollm2-fasc-kfac-0.5")
    cells = acbench.sweep(model="smollm2-135m", methods=["pca", "fasc-kfac"], rank=[0.5], output="results")
    frame = acbench.load_results("results")

Each call checks what it is given as `bench run` does and raises `acbench.UserError` with the same one line, in the
call's keywords; each leaves the caller's process as it found it (caller_state.py). One module per call:
compress_call.py, evaluate_call.py (and compare), sweep_call.py (and the results), catalogue.py (the registries, the
statistics cache, load_model).
"""

from __future__ import annotations

from acbench.api.catalogue import list_methods, list_tasks, load_model, statistics_cache
from acbench.api.compress_call import compress
from acbench.api.evaluate_call import compare, evaluate
from acbench.api.sweep_call import load_results, sweep, to_frame
from acbench.model.sources import LoadedModel
from acbench.runner.one_variant import Compressed

__all__ = ["Compressed", "LoadedModel", "compare", "compress", "evaluate", "list_methods", "list_tasks", "load_model",
           "load_results", "statistics_cache", "sweep", "to_frame"]
