"""`bench compress` and `acbench.compress` take one calibrate-then-compress path (one_variant.compress_model): a
spy put in its place sees both, and each saves the same checkpoint from the same settings."""

import json

from acbench.runner import one_variant


def test_bench_compress_and_the_python_call_share_one_path(tiny, tmp_path, monkeypatch):
    import acbench
    from acbench.cli import main

    monkeypatch.setenv("ACBENCH_STATS_CACHE", str(tmp_path / "stats"))
    real, seen = one_variant.compress_model, []

    def spy(lm, run, *args, **kwargs):
        seen.append((run.methods, run.config.calib_samples, kwargs.get("cache")))
        return real(lm, run, *args, **kwargs)

    monkeypatch.setattr(one_variant, "compress_model", spy)
    assert main(["compress", "--model", str(tiny), "--method", "whitened-svd", "--rank", "0.5", "--calib-samples",
                 "2", "--calib-seq-len", "32", "--save", str(tmp_path / "cli"), "--quiet"]) == 0
    lm = acbench.load_model(str(tiny), progress=False)
    with acbench.compress(lm, "whitened-svd", rank=0.5, calib_samples=2, calib_seq_len=32, progress=False,
                          cache=True) as c:
        c.save(tmp_path / "api")
    assert seen == [(("whitened-svd",), 2, True), (("whitened-svd",), 2, True)]
    cli, api = (json.loads((tmp_path / side / "compression.json").read_text()) for side in ("cli", "api"))
    for side in (cli, api):  # where each came from differs by design: the name the model was given by
        side.pop("source_model"), side.pop("written_by", None)
    assert cli["compression"]["groups"] == api["compression"]["groups"] and cli["calibration"]["spec"] == \
        api["calibration"]["spec"]
    weights = [(tmp_path / side / "model.safetensors").read_bytes() for side in ("cli", "api")]
    assert weights[0] == weights[1]
