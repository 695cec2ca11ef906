"""Fuzz: generated --config files (keys, option blocks, raw text, values of every YAML type) and model
config.json files; each ends in exit 0 or one line with exit 2 (tests/fuzz_common.py)."""

import json
import shutil

import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fuzz_common import assert_clean, json_value


# ---------------------------------------------------------------- YAML configs

KEYS = ["model", "methods", "rank", "ranks", "sparsity", "tasks", "blocks", "groups", "seed", "batch_size",
        "calib_samples", "method_options", "task_options", "analysis_options", "stats_memory", "allocate", "bos",
        "lama-limit", "ppl_windows", "overwrite", "progress", "bogus_key", "executor", "no_latency", "quiet",
        "task_option", "method-option", "no-report", "calibration_mode", "calibration", "margin", "until_decided", "reference"]

@given(data=st.dictionaries(st.sampled_from(KEYS) | st.integers(0, 3), json_value, max_size=5) | json_value)
def test_generated_yaml_configs(tmp_path, tiny, checked_only, data):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(data) if not isinstance(data, float) else repr(data))
    assert_clean(["run", "--config", str(cfg), "--model", str(tiny), "--output", str(tmp_path / "out"),
                  "--no-report", "--quiet"])


@given(lines=st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(["1", "pca", "[0.5]", "true", "x"])),
                     min_size=2, max_size=6), nested=st.booleans())
def test_a_config_that_sets_a_key_twice_is_one_line_naming_it(tmp_path, tiny, checked_only, lines, nested):
    """A key written twice, at the top or inside an options block, or in two spellings (no-latency and
    no_latency): YAML would keep the last silently; acbench names it."""
    norm = [k.replace("-", "_") for k, _ in lines]
    if nested:
        text = "task_options:\n  lama:\n" + "".join(f"    {k}: {v}\n" for k, v in lines)
    else:
        text = "".join(f"{k}: {v}\n" for k, v in lines)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(text)
    from fuzz_common import outcome

    rc, err = outcome(["run", "--config", str(cfg), "--model", str(tiny), "--output", str(tmp_path / "out"),
                       "--no-report", "--quiet"])
    twice = len(set(norm if not nested else [k for k, _ in lines])) < len(lines)
    if twice:
        assert rc == 2 and len(err) == 1 and "twice" in err[0], (text, err)
    else:
        assert rc == 0 or (rc == 2 and len(err) == 1), (text, err)


OPTION_NAMES = {"method_options": ["fasc", "pca", "act-sparse", "bogus"], "task_options": ["lama", "mmlu", "ppl-token"],
                "analysis_options": ["rho", "bogus"]}
option_block = st.sampled_from(sorted(OPTION_NAMES)).flatmap(lambda block: st.tuples(st.just(block), st.dictionaries(
    st.sampled_from(OPTION_NAMES[block]) | st.integers(0, 2), st.sampled_from([5, "x", [1], True, "cloze", "acc_norm"]) | st.dictionaries(
        st.sampled_from(["max_swaps", "folds", "units", "per_relation", "shots", "limit", "format", "metric"])
        | st.integers(0, 2),
        json_value, max_size=2), max_size=2)))


@settings(max_examples=30)  # derandomized, 0.5-1 s each (a call loads LAMA): 60 were 36 s of make test, 150 up to 83 s
@given(blocks=st.lists(option_block, min_size=1, max_size=3))
def test_generated_option_blocks(tmp_path, tiny, checked_only, blocks):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(dict(blocks)))
    assert_clean(["run", "--config", str(cfg), "--model", str(tiny), "--output", str(tmp_path / "out"),
                  "--tasks", "lama", "rho", "--no-report", "--quiet"])


@given(text=st.text(max_size=60))
def test_raw_config_text(tmp_path, tiny, checked_only, text):
    cfg = tmp_path / "run.yaml"
    cfg.write_bytes(text.encode("utf-8", "surrogatepass"))
    assert_clean(["run", "--config", str(cfg), "--model", str(tiny), "--output", str(tmp_path / "out"),
                  "--no-report", "--quiet"])


# ---------------------------------------------------------------- model config.json

CONFIG_KEYS = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "vocab_size", "model_type", "head_dim", "tie_word_embeddings",
               "max_position_embeddings", "rms_norm_eps", "architectures"]


@given(changes=st.dictionaries(st.sampled_from(CONFIG_KEYS), json_value, min_size=1, max_size=3),
       drop=st.lists(st.sampled_from(CONFIG_KEYS), max_size=2), run=st.booleans())
def test_generated_model_configs(tmp_path, tiny, checked_only, changes, drop, run):
    folder = tmp_path / "model"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(tiny, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    for key in drop:
        cfg.pop(key, None)
    (folder / "config.json").write_text(json.dumps(cfg))
    argv = (["run", "--model", str(folder), "--methods", "pca", "--tasks", "ppl-token", "--output",
             str(tmp_path / "out"), "--no-report", "--quiet"] if run else ["plan", "--model", str(folder)])
    assert_clean(argv)


# ---------------------------------------------------------------- config keys: values of every YAML type

def _config_keys() -> list[str]:
    from acbench.cli.run import _NEGATED
    from acbench.runner.shortcuts import shortcut_dest, task_shortcuts
    from acbench.runner.config import RunConfig

    return sorted(RunConfig.field_names() - set(_NEGATED.values()) - {"model", "output", "executor"}
                  | set(_NEGATED) | {shortcut_dest(f) for f in task_shortcuts()} | {"rank", "method_option"})


# every type YAML's safe loader produces: null, bool, int, float (nan, inf), str, binary, date, timestamp, lists
# and mappings (keys that name tasks, methods and settings, so a mapping can look like what a key expects)
yaml_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                      st.text(max_size=8), st.binary(max_size=4), st.dates(), st.datetimes(),
                      st.sampled_from(["pca", "teal", "2:4", "0.5", "ppl-token", "lama", "fasc", "0-1", "uniform"]))
yaml_value = st.recursive(yaml_leaf, lambda kids: st.one_of(
    st.lists(kids, max_size=3),
    st.dictionaries(st.sampled_from(["ppl-token", "lama", "rho", "pca", "fasc", "units", "max_swaps", "limit"])
                    | st.text(max_size=4) | st.integers(0, 3), kids, max_size=3)), max_leaves=6)


@given(key=st.sampled_from(_config_keys()), value=yaml_value, dashes=st.booleans())
@example(key="tasks", value={"ppl-token": 1}, dashes=False)
@example(key="methods", value={"pca": 1}, dashes=False)
@example(key="allocate", value={"greedy": None}, dashes=False)
def test_config_keys_with_values_of_every_yaml_type(tmp_path, tiny, checked_only, key, value, dashes):
    """Every key a --config file may hold, with a value of any YAML type: the run goes on or it is one line (a
    mapping where a list of task names belongs once ended in a TypeError)."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({key.replace("_", "-") if dashes else key: value}))
    assert_clean(["run", "--config", str(cfg), "--model", str(tiny), "--output", str(tmp_path / "out"),
                  "--no-report", "--quiet"])
