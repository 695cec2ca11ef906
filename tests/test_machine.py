"""The machine a cell was measured on: processor, vector extensions, CPUs, torch's kernels, BLAS and oneDNN, read
from the system and stored in every cell's env (a speed means nothing without it)."""

from acbench.results.store import cpu_description, environment, machine, torch_build

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_vnni
processor\t: 1
model name\t: Another CPU
flags\t\t: fpu
"""

CONFIG = """PyTorch built with:
  - Intel(R) MKL-DNN v3.12.0 (Git Hash 80afa71049cd)
  - Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release, COMMIT_SHA=cf30
"""


def test_cpu_description_reads_the_first_processor_and_the_extensions_that_matter():
    assert cpu_description(CPUINFO) == {"cpu_model": "AMD EPYC 7B13",
                                        "cpu_vector_extensions": "avx2 fma avx512f avx512_vnni"}
    arm = "processor\t: 0\nFeatures\t: fp asimd\n"
    assert cpu_description(arm)["cpu_vector_extensions"] is None  # none of the x86 extensions


def test_torch_build_names_blas_and_onednn():
    assert torch_build(CONFIG) == {"torch_blas": "mkl", "torch_onednn": "v3.12.0"}
    assert torch_build("oneDNN v3.5.3 and BLAS_INFO=open") == {"torch_blas": "open", "torch_onednn": "v3.5.3"}
    assert torch_build("") == {"torch_blas": None, "torch_onednn": None}


def test_every_cell_env_carries_the_machine_as_scalars():
    import torch

    env = environment("cpu")
    for key in ("cpu_model", "cpu_vector_extensions", "cpus_available", "torch_cpu_capability", "torch_blas",
                "torch_onednn"):
        assert key in env
        assert env[key] is None or isinstance(env[key], (str, int)), key
    assert env["torch_blas"] == torch_build(torch.__config__.show())["torch_blas"]
    assert machine() == {k: env[k] for k in machine()}  # one reading per process
