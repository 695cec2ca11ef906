"""Plain text for calibration and perplexity: the Wikipedia extract in gensim's wheel, WikiText-2, local files."""

from __future__ import annotations

import bz2
import hashlib
import importlib.util
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

from bench.cache import atomic_write_json, cache_dir
from bench.errors import UserError

GENSIM_MEMBER = ("test", "test_data", "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
EVAL_EVERY = 4  # one article in four (by a hash of its title) is evaluation text, the rest calibration


def _gensim_dump() -> Path:
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the Wikipedia extract needs gensim==4.4.0 (installed with --no-deps): run `make setup`")
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*GENSIM_MEMBER)
    if not path.exists():
        raise UserError(f"{path.name} is missing from the installed gensim: pip install --no-deps gensim==4.4.0")
    return path


def _strip(wikitext: str) -> str:
    import mwparserfromhell

    text = mwparserfromhell.parse(wikitext).strip_code(normalize=True, collapse=True)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return "\n".join(line.strip() for line in text.splitlines()).strip()


def wiki_articles(progress: bool = True) -> list[dict]:
    """[{title, text}] parsed once from gensim's dump and cached (markup stripped with mwparserfromhell)."""
    cached = cache_dir() / "data" / "enwiki_gensim_articles.json"
    if cached.exists():
        return json.loads(cached.read_text())
    from tqdm.auto import tqdm

    path = _gensim_dump()
    with bz2.open(path) as f:
        root = ET.parse(f).getroot()
    ns = root.tag.split("}")[0] + "}" if root.tag.startswith("{") else ""
    pages = root.findall(f"{ns}page")
    articles = []
    for page in tqdm(pages, desc="strip wiki markup (once)", disable=not progress):
        title = page.findtext(f"{ns}title") or ""
        text = page.findtext(f"{ns}revision/{ns}text") or ""
        if page.find(f"{ns}redirect") is not None or text.lstrip().upper().startswith("#REDIRECT"):
            continue
        body = _strip(text)
        if len(body.split()) >= 50:
            articles.append({"title": title, "text": body})
    atomic_write_json(cached, articles)
    return articles


def is_eval_article(title: str) -> bool:
    return int(hashlib.sha1(title.encode()).hexdigest(), 16) % EVAL_EVERY == 0


def wiki_split(part: str) -> str:
    """'calib' or 'eval': articles never appear in both."""
    arts = [a for a in wiki_articles() if is_eval_article(a["title"]) == (part == "eval")]
    return "\n\n".join(a["text"] for a in arts)


def wikitext2(split: str) -> str:
    from datasets import load_dataset

    try:
        ds = load_dataset("wikitext", "wikitext-2-raw-v1", split=split)
    except Exception as e:
        raise UserError(f"WikiText-2 is not reachable ({type(e).__name__}): use the embedded text (wiki) "
                        "or a local file (file:<path>)") from None
    return "\n\n".join(ds["text"])


def load_text(source: str, part: str) -> str:
    """source: 'wiki' (embedded, split by article), 'wikitext2' (hub) or 'file:<path>'."""
    if source == "wiki":
        return wiki_split(part)
    if source == "wikitext2":
        return wikitext2("train" if part == "calib" else "test")
    if source.startswith("file:"):
        path = Path(source[5:]).expanduser()
        if not path.is_file():
            raise UserError(f"text file {path} does not exist: pass file:<path to a UTF-8 text file>")
        return path.read_text(encoding="utf-8", errors="replace")
    raise UserError(f"text source '{source}' is unknown: use wiki, wikitext2 or file:<path>")


def calibration_windows(tokenizer, text: str, samples: int, seq_len: int, seed: int) -> torch.Tensor:
    """`samples` random windows of `seq_len` tokens from the calibration text (seeded)."""
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[0]
    if len(ids) < seq_len + 1:
        raise UserError(f"calibration text has {len(ids)} tokens, fewer than --calib-seq-len {seq_len}: "
                        "use shorter windows or more text")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - seq_len, (samples,), generator=gen)
    bos = getattr(tokenizer, "bos_token_id", None)
    rows = []
    for s in starts.tolist():
        w = ids[s:s + seq_len]
        if bos is not None:
            w = torch.cat([torch.tensor([bos]), w[:-1]])
        rows.append(w)
    return torch.stack(rows)
