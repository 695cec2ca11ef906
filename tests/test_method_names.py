"""How a method is named on the command line (methods/__init__.py), each rule worked out by hand: a variant's
settings parse as YAML scalars and spell one way; commas split methods except inside a variant; 'all' expands per
family in order, once each; every malformed spelling is refused in one line that names the fix."""

import pytest

from acbench import methods
from acbench.core.stats import LOW_RANK_FAMILY, SPARSITY_FAMILY, SparsitySpec


def test_parse_variant_strips_and_reads_yaml_scalars():
    assert methods.parse_variant(" pca ") == ("pca", {})
    assert methods.parse_variant("act-sparse: score = fisher ,mitigation=shift") == (
        "act-sparse", {"score": "fisher", "mitigation": "shift"})
    name, opts = methods.parse_variant("x:a=1,b=true,c=0.5,d= hi ,e=null")
    assert name == "x"
    assert opts == {"a": 1, "b": True, "c": 0.5, "d": "hi", "e": None}
    assert [type(v) for v in opts.values()] == [int, bool, float, str, type(None)]
    assert methods.parse_variant("x:path=a=b") == ("x", {"path": "a=b"})  # the first '=' ends the name


@pytest.mark.parametrize("variant, message", [
    ("act-sparse:fisher", "method 'act-sparse:fisher': settings are written name:setting=value,setting=value "
                          "('fisher' is not setting=value)"),
    ("act-sparse:=1", "method 'act-sparse:=1': settings are written name:setting=value,setting=value "
                      "('=1' is not setting=value)"),
    ("act-sparse: =1", "(' =1' is not setting=value)"),
    ("act-sparse:a=1, a =2", "method 'act-sparse:a=1, a =2': setting a is given twice: keep one"),
    ("act-sparse:a=[1", "method 'act-sparse:a=[1': the value of a does not parse"),
])
def test_parse_variant_refuses_in_one_line(variant, message):
    with pytest.raises(ValueError) as err:
        methods.parse_variant(variant)
    assert message in str(err.value)
    assert err.value.__cause__ is None
    if "does not parse" in message:  # one line: the YAML error is not chained under it
        assert err.value.__suppress_context__


def test_canonical_sorts_settings_and_lowercases_booleans():
    assert methods.canonical("pca", {}) == "pca"
    assert methods.canonical("x", {"b": True, "a": 1, "c": False, "d": "Shift"}) == "x:a=1,b=true,c=false,d=Shift"


def test_base_name_family_and_pattern_problem_read_the_base_method():
    assert methods.base_name(" act-sparse :score=fisher") == "act-sparse"
    assert methods.base_name("pca") == "pca"
    assert methods.family_of("act-sparse:score=fisher") == SPARSITY_FAMILY
    assert methods.family_of("pca") == LOW_RANK_FAMILY
    nm, density = SparsitySpec.parse("2:4"), SparsitySpec.parse("0.5")
    assert methods.pattern_problem("teal:x=1", nm) == methods.get_method("teal").pattern_problem(nm)
    assert "teal keeps the channels above a threshold" in methods.pattern_problem("teal:x=1", nm)
    assert methods.pattern_problem("teal", density) is None
    assert methods.pattern_problem("act-sparse", nm) is None


def test_build_puts_the_variants_settings_over_the_options():
    m = methods.build("act-sparse:score=fisher", {"score": "abs", "mitigation": "shift"})
    assert (m.name, m.settings.score, m.settings.mitigation) == ("act-sparse", "fisher", "shift")
    assert methods.build("act-sparse").settings == methods.get_method("act-sparse").Settings()
    assert methods.build("act-sparse", None).settings == methods.build("act-sparse", {}).settings


def test_known_methods_filter_by_family():
    every = methods.known_methods()
    assert every == methods.REGISTRY.names()
    low, sparse = methods.known_methods(LOW_RANK_FAMILY), methods.known_methods(SPARSITY_FAMILY)
    assert sorted(low + sparse) == sorted(every) and not set(low) & set(sparse)
    assert "pca" in low and "act-sparse" in sparse


def test_split_methods_keeps_a_variants_settings_together():
    assert methods.split_methods("pca") == ["pca"]
    assert methods.split_methods(" pca , svd ") == ["pca", "svd"]
    assert methods.split_methods(["pca,act-sparse:score=fisher,mitigation=shift", "wanda"]) == [
        "pca", "act-sparse:score=fisher,mitigation=shift", "wanda"]
    # a setting follows only a variant: after a plain name, or first, it is a name of its own (refused later)
    assert methods.split_methods("pca,a=1") == ["pca", "a=1"]
    assert methods.split_methods("a=1,pca") == ["a=1", "pca"]
    assert methods.split_methods(["x:a=1", "b=2"]) == ["x:a=1,b=2"]
    assert methods.split_methods("x:a=1,y:b=2") == ["x:a=1", "y:b=2"]


@pytest.mark.parametrize("spec", ["pca,,svd", "pca,", ",pca", ["pca", ""]])
def test_split_methods_refuses_an_empty_item(spec):
    item = spec if isinstance(spec, str) else ""
    with pytest.raises(ValueError) as err:
        methods.split_methods(spec)
    assert str(err.value) == (f"--methods '{item}': an empty name or setting between commas: remove the extra "
                              "comma")


def test_expand_methods_all_in_family_order_once_each():
    low, sparse = methods.known_methods(LOW_RANK_FAMILY), methods.known_methods(SPARSITY_FAMILY)
    assert methods.expand_methods("all") == low + sparse
    assert methods.expand_methods("all", [SPARSITY_FAMILY, LOW_RANK_FAMILY]) == sparse + low
    assert methods.expand_methods(["all"], [SPARSITY_FAMILY]) == sparse
    assert methods.expand_methods("svd,pca,svd,all", [LOW_RANK_FAMILY]) == ["svd", "pca"] + [
        m for m in low if m not in ("svd", "pca")]
    assert methods.expand_methods("all,act-sparse:score=fisher", [SPARSITY_FAMILY]) == sparse + [
        "act-sparse:score=fisher"]
    assert methods.expand_methods("act-sparse:score=fisher,mitigation=shift,pca") == [
        "act-sparse:mitigation=shift,score=fisher", "pca"]
    with pytest.raises(methods.UnknownName, match="pcaa"):
        methods.expand_methods("pca,pcaa")
