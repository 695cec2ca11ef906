"""Benchmarks report ratios between pairs measured in the same run (never absolute times against a bound)."""

import pytest

# (numerator, denominator, what the ratio means, target)
RATIOS = [
    ("test_gradient_statistics", "test_plain_forward", "gradient statistics / plain forward (same tokens)", "<= 3"),
    ("test_mmlu_lm_eval_bridge", "test_mmlu_native", "MMLU: lm-eval bridge time / native time", ">= 4"),
    ("test_lama_brute_force", "test_lama_shared_prompt", "LAMA: brute-force time / shared-prompt scorer time", ">= 10"),
    ("test_lama_probes_one_by_one", "test_lama_probes_batched",
     "LAMA: probes/s of the batched scorer / one-by-one scorer (32 probes x 25 candidates)", ">= 5"),
    ("test_group_forward[8:16 masked]", "test_group_forward[dense]",
     "one attention input group (d = 2048, 256 tokens): 8:16-masked forward / dense forward", "<= 1.3"),
    ("test_rho[4096]", "test_rho[640]", "rho cost d=4096 / d=640 (N = 512, m = d/2)", "19.5 from the cost formula 2N^2 d + 2N d m"),
]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    session = getattr(config, "_benchmarksession", None)
    if not session or not session.benchmarks:
        return
    med = {}
    for b in session.benchmarks:
        if b.stats is not None:
            med[b.name] = b.stats.median
    terminalreporter.write_sep("-", "acbench ratios (medians, this run)")
    for num, den, what, target in RATIOS:
        if num in med and den in med:
            terminalreporter.write_line(f"{what}: {med[num] / med[den]:.2f}x (target {target})")
    for name in sorted(med):
        if name.startswith("test_solve["):
            terminalreporter.write_line(f"{name}: {med[name] * 1e3:.1f} ms per group")


@pytest.fixture(scope="session")
def default_model():
    from bench.models import load_model

    return load_model("gemma-3-270m", progress=False)
