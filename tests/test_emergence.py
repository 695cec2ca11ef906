"""Knowledge emergence: the corpus, training (a real learning signal, exact resumption), and the summary code."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from acbench.studies.emergence import bootstrap_mean, recall_onset, rise_onset, summarize
from acbench.studies.emergence.train import TrainConfig, batch_at, checkpoint_steps, train, word_tokenizer
from acbench.tasks.data.facts import RELATIONS, build_corpus


def test_corpus_is_deterministic_and_probe_sentences_never_occur_in_training():
    a, b = build_corpus(entities=60, seed=3), build_corpus(entities=60, seed=3)
    assert a.train_documents == b.train_documents and a.facts == b.facts and a.heldout_text == b.heldout_text
    assert build_corpus(entities=60, seed=4).facts != a.facts
    text = "\n".join(a.train_documents)
    for rel in a.facts:
        head = RELATIONS[rel][2].split("[Y]")[0]
        for e in a.probed:
            assert head.replace("[X]", e).strip() not in text  # a probed fact's probe prompt is never read
        taught = [e for e in a.entities if e not in set(a.probed)]
        assert head.replace("[X]", taught[0]).strip() in text  # the format set teaches the template
        assert all(f"{e} " in text for e in a.probed)  # every probed entity's facts are in training
    assert set(a.probed) & a.rare and set(a.probed) - a.rare  # some probed facts are rare, some common
    tok = word_tokenizer(a.words)
    values = [v for r in RELATIONS.values() for v in r[0]]
    assert all(len(tok.encode(" " + v, add_special_tokens=False)) == 1 for v in values)  # one token each


def test_checkpoint_steps():
    assert checkpoint_steps(3000) == [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 3000]
    assert checkpoint_steps(64) == [0, 16, 32, 64]
    assert checkpoint_steps(100, "linear")[:3] == [0, 10, 20]


def _seen_fact_p1(model, tok, corpus, n: int = 60) -> tuple[float, float]:
    """P@1 of a fact's value at a training template's [Y], over the relation's values (a memorisation probe)."""
    hits, chance = [], []
    model.eval()
    for rel, per in corpus.facts.items():
        values, template = RELATIONS[rel][0], RELATIONS[rel][1][0]
        ids = [tok.convert_tokens_to_ids(v) for v in values]
        for e in [x for x in corpus.entities if x not in corpus.rare][: n // len(corpus.facts)]:
            prompt = template.split("[Y]")[0].replace("[X]", e).strip()
            with torch.no_grad():
                logits = model(torch.tensor([tok.encode(prompt, add_special_tokens=False)])).logits[0, -1]
            hits.append(float(values[int(logits[ids].argmax())] == per[e]))
            chance.append(1 / len(values))
    return sum(hits) / len(hits), sum(chance) / len(chance)


@pytest.mark.slow
def test_training_learns_seen_facts(tmp_path):
    from transformers import AutoModelForCausalLM

    corpus = build_corpus(entities=24, seed=0, mentions=16)
    tok = word_tokenizer(corpus.words)
    cfg = TrainConfig(layers=2, d_model=64, steps=320, batch_size=16, seq_len=64, lr=5e-3, warmup=20)
    paths = train(tmp_path / "run", "t", tok, corpus.train_documents, cfg, progress=False)
    p0, chance = _seen_fact_p1(AutoModelForCausalLM.from_pretrained(paths[0]), tok, corpus)
    p1, _ = _seen_fact_p1(AutoModelForCausalLM.from_pretrained(paths[-1]), tok, corpus)
    assert p0 <= chance + 0.15 and p1 >= max(0.5, 4 * chance), (p0, p1, chance)


def test_a_killed_training_resumes_to_the_same_weights(tmp_path):
    import shutil

    from transformers import AutoModelForCausalLM

    from acbench.core.errors import UserError

    corpus = build_corpus(entities=12, seed=0)
    tok = word_tokenizer(corpus.words)
    cfg = TrainConfig(layers=1, d_model=32, steps=48, batch_size=4, seq_len=32, warmup=4)
    full = train(tmp_path / "full", "t", tok, corpus.train_documents, cfg, progress=False)
    # killed between the step-32 and step-48 checkpoints: what it leaves is the checkpoints up to 32
    shutil.copytree(tmp_path / "full", tmp_path / "killed")
    shutil.rmtree(tmp_path / "killed" / "t-step000048")
    (tmp_path / "killed" / "t-train.json").unlink()
    resumed = train(tmp_path / "killed", "t", tok, corpus.train_documents, cfg, progress=False)
    a = AutoModelForCausalLM.from_pretrained(resumed[-1]).state_dict()
    b = AutoModelForCausalLM.from_pretrained(full[-1]).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert json.loads((tmp_path / "killed" / "t-train.json").read_text())["from_step"] == 32
    with pytest.raises(UserError, match="other training settings"):  # a folder of another run is not resumed
        train(tmp_path / "killed", "t", tok, corpus.train_documents, replace(cfg, lr=1e-3), progress=False)


def test_batches_depend_on_the_step_alone():
    stream = torch.arange(10_000)
    cfg = TrainConfig(batch_size=4, seq_len=16, seed=1)
    assert torch.equal(batch_at(stream, cfg, 7), batch_at(stream, cfg, 7))
    assert not torch.equal(batch_at(stream, cfg, 7), batch_at(stream, cfg, 8))


def _tiny_series(tmp_path):
    """A corpus, two checkpoints of a one-layer model on it (steps 0 and 16), and its probes as a LAMA source."""
    corpus = build_corpus(entities=12, seed=0)
    tok = word_tokenizer(corpus.words)
    paths = train(tmp_path / "ck", "t", tok, corpus.train_documents,
                  TrainConfig(layers=1, d_model=32, steps=16, batch_size=4, seq_len=32), progress=False)
    return corpus, paths, corpus.write_lama(tmp_path / "data")


def test_checkpoints_load_through_bench_run(tmp_path):
    from acbench.cli import main

    corpus, paths, lama = _tiny_series(tmp_path)
    _, heldout = corpus.write_text(tmp_path / "data")
    out = tmp_path / "results"
    assert main(["run", "--model", str(paths[-1]), "--methods", "pca", "--rank", "0.5", "--tasks", "lama",
                 "ppl-token", "--task-option", f"lama.source={lama}", "--task-option", "lama.protocol=vocab", "--lama-limit", "0",
                 "--text-source", heldout, "--calib-source", heldout, "--calib-samples", "2", "--calib-seq-len",
                 "16", "--ppl-seq-len", "16", "--ppl-windows", "2", "--output", str(out), "--no-report", "--quiet",
                 "--no-latency"]) == 0
    cells = [json.loads(p.read_text()) for p in out.rglob("lama-*.json")]
    assert len(cells) == 2 and all(c["details"]["n_probes_kept"] == 6 * len(RELATIONS) for c in cells)


def _point(step, p1, above, rho_block, gap=None):
    return {"step": step, "p1": p1, "above": above, "chance": 0.05, "rho_block": rho_block, "gap": gap}


def test_onsets_correlations_and_verdict_on_hand_made_curves():
    assert rise_onset([0, 16, 32, 64], [0.1, 0.1, 0.5, 0.9]) == 32  # a quarter of the 0.8 rise, kept from 32
    assert rise_onset([0, 16, 32, 64, 128], [0.1, 0.4, 0.1, 0.5, 0.9]) == 64  # the rise at 16 is not kept
    assert rise_onset([0, 16], [0.5, 0.4]) is None
    series = [_point(0, 0.05, False, {0: 0.10, 1: 0.20}), _point(16, 0.06, False, {0: 0.12, 1: 0.19}),
              _point(64, 0.30, True, {0: 0.40, 1: 0.25}, gap=0.02), _point(256, 0.60, True, {0: 0.70, 1: 0.28}, 0.05)]
    assert recall_onset(series) == 64
    assert recall_onset(series[:2] + [_point(64, 0.3, True, {}), _point(99, 0.1, False, {})]) is None
    s = summarize({0: series, 1: series})
    assert s["per_seed"][0]["recall_onset"] == 64 and s["per_seed"][0]["rho_onset"] == {0: 64, 1: 64}
    assert s["spearman"][0]["mean"] == pytest.approx(1.0) and s["gap"][256]["mean"] == pytest.approx(0.05)
    assert s["spearman"][1]["mean"] == pytest.approx(0.8)
    assert s["verdict"]["state"] == "holds" and s["verdict"]["tracking_blocks"] == [0, 1]
    early = [dict(p, rho_block={0: v, 1: 0.2}) for p, v in zip(series, (0.1, 0.9, 0.9, 0.95))]
    assert summarize({0: early})["verdict"]["state"] == "does not hold"  # rho rose at 16, recall at 64
    flat = [dict(p, above=False) for p in series]
    assert summarize({0: flat})["verdict"]["state"] == "inconclusive"


def test_bootstrap_over_seeds():
    m = bootstrap_mean([0.2, 0.4, 0.6])
    assert m["mean"] == pytest.approx(0.4) and 0.2 <= m["ci95"][0] < m["ci95"][1] <= 0.6
    assert bootstrap_mean([0.3])["ci95"] is None and bootstrap_mean([math.nan])["mean"] is None


def test_the_emerge_cell_round_trips_and_renders(tmp_path):
    from acbench.studies.emergence import EmergeConfig, report_section, summary_cell
    from acbench.results.store import write_cell
    from acbench.core.record import CellRecord

    series = [_point(0, 0.05, False, {0: 0.10}), _point(16, 0.06, False, {0: 0.12}),
              _point(64, 0.30, True, {0: 0.40}, gap=0.02), _point(256, 0.60, True, {0: 0.70}, 0.05)]
    cell = summary_cell(EmergeConfig(seeds=(0, 1)), summarize({0: series, 1: series}), {0: {"total_s": 1.0}})
    write_cell(tmp_path / "emerge.json", cell)
    back = CellRecord.from_json(json.loads((tmp_path / "emerge.json").read_text()))
    assert back.cell.is_analysis and back.metrics["recall_onset_step"] == 64
    lines, figures = report_section(back, tmp_path / "plots", "emerge", "test")
    text = "\n".join(lines)
    assert "It holds:" in text and "block 0 (Spearman +1.00" in text
    assert figures[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_control_corpus_holds_no_association():
    real, control = build_corpus(entities=40, seed=2), build_corpus(entities=40, seed=2, control=True)
    assert real.facts == control.facts and real.probed == control.probed  # the same probes
    text = " ".join(control.train_documents)
    rel, per = "birth_city", control.facts["birth_city"]
    template = RELATIONS[rel][1][0].split("[Y]")[0]
    seen = {e: set() for e in per}
    for e in per:
        head = template.replace("[X]", e)
        for part in text.split(head)[1:]:
            seen[e].add(part.split()[0])
    assert sum(len(v) > 1 for v in seen.values() if v) > len(per) / 2  # an entity's city varies between mentions


def test_a_users_checkpoint_series(tmp_path):
    """`bench emerge --checkpoints-from`: the same sweep and summary over checkpoints made elsewhere."""
    from acbench.cli import main

    corpus, paths, lama = _tiny_series(tmp_path)
    out = tmp_path / "results"
    assert main(["emerge", "--checkpoints-from", *map(str, paths), "--lama-source", lama, "--output", str(out),
                 "--quiet"]) == 0
    cell = json.loads(next(out.rglob("emerge-*.json")).read_text())
    steps = [p["step"] for p in cell["details"]["summary"]["series"]["0"]]
    assert steps == [0, 16] and cell["details"]["checkpoints"] == [str(p) for p in paths]
    assert (out / "EMERGENCE.md").read_text().startswith("# acbench: knowledge emergence")


@pytest.mark.parametrize("args, needle", [
    (["--d-model", "3"], "width 3"), (["--d-model", "17"], "width 17"), (["--d-model", "130"], "width 65"),
    (["--work", "/proc/x"], "--work /proc/x is not writable")])
def test_emerge_sizes_and_folders_it_cannot_use_are_one_line(tmp_path, capsys, args, needle):
    from acbench.cli import main

    assert main(["emerge", *args, "--steps", "2", "--output", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "out").exists()


def test_checkpoint_series_are_ordered_by_step_and_never_repeat_one(tmp_path):
    from acbench.studies.emergence.command import _steps_of
    from acbench.core.errors import UserError

    names = [str(tmp_path / n) for n in ("step64", "step0", "checkpoint-16")]
    folders, steps = _steps_of(names)
    assert steps == [0, 16, 64] and [f.name for f in folders] == ["step0", "checkpoint-16", "step64"]
    plain = [str(tmp_path / n) for n in ("b", "a")]
    assert _steps_of(plain) == ([tmp_path / "b", tmp_path / "a"], [0, 1])  # no steps in the names: as given
    with pytest.raises(UserError, match="twice"):
        _steps_of([names[0], names[1], names[0] + "/"])
    with pytest.raises(UserError, match="both step 16"):
        _steps_of([str(tmp_path / "x" / "step16"), str(tmp_path / "checkpoint-16")])


def test_a_checkpoint_series_of_two_models_is_refused_in_one_line(tmp_path, capsys):
    """Two training runs' checkpoints given as one series would be read as one model's onset."""
    import json
    import shutil

    from acbench.cli import main
    from acbench.cli.smoke import tiny_checkpoint

    a, b = tmp_path / "run-a" / "step0", tmp_path / "run-b" / "step16"
    shutil.copytree(tiny_checkpoint(), a)
    shutil.copytree(tiny_checkpoint(), b)
    cfg = json.loads((b / "config.json").read_text())
    (b / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    argv = ["emerge", "--checkpoints-from", str(a), str(b), "--output", str(tmp_path / "out"), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mixes models" in err[0] and "num_hidden_layers 3" in err[0], err
    (b / "config.json").write_text(json.dumps(cfg))
    (b / "tokenizer.json").write_text((b / "tokenizer.json").read_text().replace('"', "'", 1) + " ")
    assert main(argv) == 2
    assert "different tokenizers" in capsys.readouterr().err
