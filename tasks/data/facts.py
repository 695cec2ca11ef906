"""A synthetic fact corpus for the knowledge-emergence experiment (docs/design.md, section 10): seeded, built in
seconds, nothing downloaded.

Entities (made-up two-word names) get one random value per relation; each fact is written in several training
templates among filler sentences. Each relation's probe template is held out of the training text for every probed
entity: it is taught only on the other half of the entities (the format set, as Allen-Zhu & Li teach a question
format on some people and test it on others; no model could know what a template never seen with any fact asks),
so recall at a probe is knowledge stored from the training templates, not a completion the model has read. A fraction of entities is rare (their facts occur a few times),
so recall is not all-or-nothing. Every value and name is one whitespace word: a word-level tokenizer over the
corpus makes each object one token (LAMA's vocabulary protocol applies to every probe).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from acbench.core.io import atomic_write_text

_SYLLABLES = ("al", "ba", "cor", "da", "el", "fen", "ga", "hol", "is", "jo", "ka", "lu", "mor", "na", "ov", "pe",
              "quin", "ra", "sol", "ta", "ur", "vel", "wy", "xan", "yo", "zer")

# relation: (values, training templates, the held-out probe template); [X] the entity, [Y] the value
RELATIONS = {
    "birth_city": (
        ("Paris", "Lima", "Oslo", "Cairo", "Quito", "Dakar", "Hanoi", "Kyoto", "Porto", "Turin", "Perth", "Davos",
         "Bern", "Riga", "Sofia", "Minsk", "Tunis", "Accra", "Lagos", "Dhaka", "Delhi", "Seoul", "Tokyo", "Baku",
         "Kabul", "Doha", "Muscat", "Rabat", "Malmo", "Graz"),
        ("[X] was born in [Y] .", "The birthplace of [X] is [Y] .", "[X] grew up in [Y] , the city of birth ."),
        "[X] is a native of [Y] ."),
    "employer": (
        ("Acme", "Globex", "Initech", "Umbrella", "Hooli", "Stark", "Wayne", "Cyberdyne", "Tyrell", "Soylent",
         "Vandelay", "Wonka", "Oscorp", "Gringotts", "Monarch", "Virtucon", "Nakatomi", "Massive", "Aperture",
         "Abstergo"),
        ("[X] works for [Y] .", "The employer of [X] is [Y] .", "[X] has a job at [Y] ."),
        "[X] is employed by [Y] ."),
    "field": (
        ("physics", "botany", "geology", "music", "law", "medicine", "history", "poetry", "chemistry", "economics",
         "sculpture", "astronomy", "linguistics", "zoology", "architecture", "philosophy"),
        ("[X] studied [Y] .", "The field of [X] is [Y] .", "[X] earned a degree in [Y] ."),
        "[X] is an expert in [Y] ."),
    "birth_year": (
        tuple(str(y) for y in range(1950, 2000)),
        ("[X] was born in the year [Y] .", "The birth year of [X] is [Y] .", "[X] arrived in the world in [Y] ."),
        "[X] has been alive since [Y] ."),
}

_FILLER_WORDS = ("the", "a", "river", "market", "winter", "morning", "old", "quiet", "town", "road", "bridge",
                 "garden", "rain", "light", "story", "window", "train", "evening", "small", "long", "green", "stone",
                 "letter", "song", "hill", "harbour", "lamp", "field", "book", "door")
_FILLER_TEMPLATES = ("The {0} near the {1} was {2} .", "A {0} {1} crossed the {2} .",
                     "In the {0} , the {1} looked {2} .", "Nobody saw the {0} by the {1} that {2} .")


@dataclass
class FactCorpus:
    seed: int
    entities: list[str]
    facts: dict[str, dict[str, str]]  # relation -> entity -> value
    rare: set[str]  # entities whose facts are seen rarely
    probed: list[str]  # the entities whose facts are probed (their probe sentences never occur in training)
    train_documents: list[str] = field(default_factory=list)
    heldout_text: str = ""

    @property
    def words(self) -> list[str]:
        """Every whitespace word the corpus and its probes use, in a fixed order (the tokenizer's vocabulary)."""
        seen: dict[str, None] = {}
        texts = self.train_documents + [self.heldout_text]
        texts += [RELATIONS[r][2].replace("[X]", e).replace("[Y]", v) for r, per in self.facts.items()
                  for e, v in per.items()]
        for text in texts:
            for w in text.split():
                seen.setdefault(w, None)
        return list(seen)

    def probe_templates(self) -> dict[str, str]:
        return {r: RELATIONS[r][2] for r in self.facts}

    def write_lama(self, folder: Path) -> str:
        """The probes in the original LAMA layout (one jsonl per relation and a relations file); returns the LAMA
        source string (`--task-option lama.source=...`)."""
        folder = Path(folder)
        for rel, per in self.facts.items():
            atomic_write_text(folder / "probes" / f"{rel}.jsonl", "".join(
            json.dumps({"sub_label": e, "obj_label": per[e]}) + "\n" for e in self.probed))
        atomic_write_text(folder / "relations.jsonl", "".join(
            json.dumps({"relation": r, "template": t}) + "\n" for r, t in self.probe_templates().items()))
        return f"lama:{folder / 'probes'}:{folder / 'relations.jsonl'}"

    def write_text(self, folder: Path) -> tuple[str, str]:
        """(training text source, held-out text source) as `file:` sources for calibration and ppl-token."""
        folder = Path(folder)
        atomic_write_text(folder / "train.txt", "\n\n".join(self.train_documents) + "\n")
        atomic_write_text(folder / "heldout.txt", self.heldout_text + "\n")
        return f"file:{folder / 'train.txt'}", f"file:{folder / 'heldout.txt'}"


def entity_names(n: int, rng: random.Random) -> list[str]:
    names: dict[str, None] = {}
    while len(names) < n:
        first = "".join(rng.choice(_SYLLABLES) for _ in range(2)).capitalize()
        last = "".join(rng.choice(_SYLLABLES) for _ in range(3)).capitalize()
        names.setdefault(f"{first} {last}", None)
    return list(names)


def _filler(rng: random.Random) -> str:
    return rng.choice(_FILLER_TEMPLATES).format(*(rng.choice(_FILLER_WORDS) for _ in range(3)))


def _documents(corpus: FactCorpus, rng: random.Random, mentions: int, rare_mentions: int, filler: float,
               sentences_per_doc: int = 8, control: bool = False) -> list[str]:
    """`control`: every mention of a fact draws a fresh value, so the text holds no association to learn."""
    sentences = []
    probed = set(corpus.probed)
    for rel, per in corpus.facts.items():
        templates, values = RELATIONS[rel][1], RELATIONS[rel][0]
        value = (lambda v: rng.choice(values)) if control else (lambda v: v)
        for e, v in per.items():
            for i in range(rare_mentions if e in corpus.rare else mentions):
                sentences.append(templates[i % len(templates)].replace("[X]", e).replace("[Y]", value(v)))
            if e not in probed and mentions > 1:  # the format set: the probe template with its facts, twice
                sentences += [RELATIONS[rel][2].replace("[X]", e).replace("[Y]", value(v)) for _ in range(2)]
    sentences += [_filler(rng) for _ in range(int(len(sentences) * filler))]
    rng.shuffle(sentences)
    return [" ".join(sentences[i:i + sentences_per_doc]) for i in range(0, len(sentences), sentences_per_doc)]


def build_corpus(entities: int = 400, seed: int = 0, relations: tuple[str, ...] = tuple(RELATIONS),
                 mentions: int = 12, rare_fraction: float = 0.3, rare_mentions: int = 2,
                 filler: float = 0.3, control: bool = False) -> FactCorpus:
    """`mentions` occurrences of each common fact (its templates in turn), `rare_mentions` of a rare one;
    `filler` filler sentences per fact sentence. The held-out text repeats the facts in their training templates
    (a different seeded order): its perplexity measures the corpus's language, not the probes. `control`: the
    same sentences with a fresh random value at every mention (the same entities, templates and probes), the
    experiment's control: whatever rises in it rises without facts."""
    rng = random.Random(seed)
    names = entity_names(entities, rng)
    facts = {r: {e: rng.choice(RELATIONS[r][0]) for e in names} for r in relations}
    rare = set(rng.sample(names, int(round(rare_fraction * entities))))
    corpus = FactCorpus(seed, names, facts, rare, probed=names[entities // 2:])
    corpus.train_documents = _documents(corpus, rng, mentions, rare_mentions, filler, control=control)
    corpus.heldout_text = " ".join(_documents(corpus, random.Random(seed + 10_000), 1, 1, filler)[:64])
    return corpus
