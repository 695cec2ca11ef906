"""Masked 2:4 weights on sparse tensor cores (torch's semi-structured sparse tensors) where they apply, dense-shaped
weights with zeros elsewhere, and the cell's conditions saying which ran and why. The conversion itself needs a
GPU (the last test runs there); the CPU tests cover every refusal, the fallback and the checkpoint's plain copy."""

from types import SimpleNamespace

import pytest
import torch

import acbench.deploy.semi_structured as ss
from acbench.calibration.engine import CalibSpec, calibrate
from acbench.deploy.compression import compressed, deploy
from acbench.model.groups import find_input_groups
from acbench.measure.latency import LatencySpec, compare_latency, masked_weight_kernel
from acbench.core.stats import SparsitySpec

from conftest import tiny_model

LIMITS = {torch.float16: SimpleNamespace(sparse_min_rows=32, sparse_min_cols=64),
          torch.bfloat16: SimpleNamespace(sparse_min_rows=32, sparse_min_cols=64)}
BACKEND = SimpleNamespace(_DTYPE_SHAPE_CONSTRAINTS=LIMITS, BACKEND="cutlass")


def weight(device="cuda", dtype=torch.float16, shape=(64, 128)):
    return SimpleNamespace(device=torch.device(device), dtype=dtype, shape=shape)


@pytest.mark.parametrize("w,n,m,capability,why", [
    (weight(), 2, 4, (9, 0), None),
    (weight(dtype=torch.bfloat16, shape=(32, 64)), 2, 4, (8, 0), None),
    (weight(), 0, 0, (9, 0), "unstructured weights: sparse tensor cores run 2:4 only"),
    (weight(), 4, 8, (9, 0), "4:8 weights: sparse tensor cores run 2:4 only"),
    (weight(device="cpu"), 2, 4, None, "no CPU kernel in torch exploits 2:4 weights"),
    (weight(), 2, 4, (7, 5), "compute capability 7.5: sparse tensor cores need 8.0 or later"),
    (weight(dtype=torch.float32), 2, 4, (9, 0), "cutlass takes float16, bfloat16, not float32"),
    (weight(shape=(64, 96)), 2, 4, (9, 0), "shape 64x96: cutlass needs multiples of 32x64"),
    (weight(shape=(48, 128)), 2, 4, (9, 0), "shape 48x128: cutlass needs multiples of 32x64"),
])
def test_each_refusal_names_why_the_weight_stays_dense(w, n, m, capability, why):
    assert ss.refusal(w, n, m, capability=capability, cls=BACKEND) == why


def test_deploy_converts_only_where_nothing_refuses(monkeypatch):
    w = torch.randn(64, 128).t().contiguous().t()  # not contiguous: the converter is handed a contiguous copy
    got = []
    convert = lambda t: got.append(t) or t * 2
    assert ss.deploy_semi_structured(w, 2, 4, convert) is w and not got  # on CPU: refused, the weight as it is
    monkeypatch.setattr(ss, "refusal", lambda *a, **k: None)
    out = ss.deploy_semi_structured(w, 2, 4, convert)
    assert len(got) == 1 and got[0].is_contiguous() and torch.equal(got[0], w) and torch.equal(out, w * 2)


@pytest.mark.parametrize("sparsity,want", [
    ("2:4", "dense: no CPU kernel in torch exploits 2:4 weights"),
    ("0.5", "dense: unstructured weights: sparse tensor cores run 2:4 only"),
])
def test_masked_weights_stay_dense_on_cpu_and_the_conditions_say_why(windows, sparsity, want):
    model = tiny_model("llama", hidden=32, inter=48)
    stats = calibrate(model, find_input_groups(model), windows, frozenset({"C"}), CalibSpec(), progress=False)
    spec = LatencySpec(prompt_len=8, new_tokens=2, prefill_len=8, batch=2, min_rounds=2, seconds=0.2)
    with torch.no_grad():
        dep = deploy(model, "wanda", SparsitySpec.parse(sparsity), stats, progress=False)
        weights = [mod.weight for mod in dep.model.modules() if isinstance(mod, torch.nn.Linear)]
        assert not any(ss.is_semi_structured(w) for w in weights)
        assert masked_weight_kernel(dep.model) == want
        got = compare_latency(dep.model, dep.dense_switch(), spec)
        dep.restore()
    assert got["conditions"]["weight_kernel"] == want and got["conditions"]["decode_kernel"] is None
    assert masked_weight_kernel(model) is None  # dense again: no masked site


def test_densified_puts_plain_weights_in_for_a_save_and_back_after(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    marked = model[0].weight
    import acbench.model.checkpoint as ckpt

    monkeypatch.setattr(ckpt, "_semi_structured", lambda w: w is marked)
    monkeypatch.setattr(type(marked), "to_dense", lambda self: self.detach() + 0, raising=False)
    keep = model[1].weight
    with ckpt.densified(model):
        assert model[0].weight is not marked and torch.equal(model[0].weight, marked)
        assert model[1].weight is keep
    assert model[0].weight is marked


def test_a_checkpoint_is_written_with_its_weights_densified(tmp_path, monkeypatch):
    import acbench.model.checkpoint as ckpt

    seen = []

    class Spy:
        def __init__(self, model):
            seen.append(model)

        def __enter__(self):
            seen.append("in")

        def __exit__(self, *exc):
            seen.append("out")

    monkeypatch.setattr(ckpt, "densified", Spy)
    model = tiny_model("llama", hidden=32, inter=48)
    real = model.save_pretrained
    monkeypatch.setattr(model, "save_pretrained", lambda folder, **kw: seen.append("saved") or real(folder, **kw))
    with pytest.raises(ValueError, match="records no compression layout"):  # the dense model: the save ran inside
        ckpt.write_checkpoint(model, None, tmp_path / "out", {})
    assert seen == [model, "in", "saved", "out"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the conversion needs sparse tensor "
                                                         "cores (benchmarks/gpu_check.sh runs this)")
def test_wanda_2_4_runs_on_sparse_tensor_cores_and_saves_as_plain_weights(windows, tmp_path):
    from acbench.model.checkpoint import densified, load_checkpoint, write_checkpoint

    if torch.cuda.get_device_capability() < ss.MIN_CAPABILITY:
        pytest.skip("this GPU has no sparse tensor cores")
    model = tiny_model("llama", hidden=64, inter=128).to("cuda", torch.float16)
    stats = calibrate(model, find_input_groups(model), windows.cuda(), frozenset({"C"}), CalibSpec(), progress=False)
    with torch.no_grad(), compressed(model, "wanda", SparsitySpec.parse("2:4"), stats, progress=False) as (m, _):
        sparse = [mod for mod in m.modules() if isinstance(mod, torch.nn.Linear) and ss.is_semi_structured(mod.weight)]
        assert sparse and masked_weight_kernel(m).startswith("semi-structured (")
        got = m(windows[:1].cuda()).logits.float()
        with densified(m):
            want = m(windows[:1].cuda()).logits.float()
        write_checkpoint(m, None, tmp_path / "ckpt", {})
    assert float((got - want).abs().max()) <= 2e-2 * float(want.abs().max())
    loaded = load_checkpoint(tmp_path / "ckpt", dtype=torch.float16).to("cuda")
    with torch.no_grad():
        again = loaded(windows[:1].cuda()).logits.float()
    assert torch.allclose(again, want, rtol=0, atol=1e-3 * float(want.abs().max()))


def test_a_compressed_subclass_renames_checkpoint_keys_as_its_base_does():
    """transformers renames GPT-NeoX's saved head by class name (`embed_out` <-> `lm_head`): the compressed
    subclass registers the same renames under its own name, or a saved head would not load back; a base without
    renames registers none."""
    from transformers import GPTNeoXForCausalLM, LlamaForCausalLM
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    from acbench.core.compressed_layers import compressed_subclass

    sub = compressed_subclass(GPTNeoXForCausalLM)
    assert compressed_subclass(GPTNeoXForCausalLM).__name__ == sub.__name__  # built again (each load): no clash
    assert sub.__name__ == "CompressedGPTNeoXForCausalLM" and issubclass(sub, GPTNeoXForCausalLM)
    base_map = get_checkpoint_conversion_mapping("GPTNeoXForCausalLM")
    got = get_checkpoint_conversion_mapping(sub.__name__)
    assert base_map and got is not None
    assert [(r.source_patterns, r.target_patterns) for r in got] == [(r.source_patterns, r.target_patterns)
                                                                      for r in base_map]
    compressed_subclass(LlamaForCausalLM)
    assert get_checkpoint_conversion_mapping("CompressedLlamaForCausalLM") is None
