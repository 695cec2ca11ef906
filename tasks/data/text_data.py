"""Plain text for calibration and perplexity: the Wikipedia extract in gensim's wheel, WikiText-2, local files."""

from __future__ import annotations

import bz2
import hashlib
import importlib.util
import json
import re
from contextvars import ContextVar
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

from acbench.core.io import atomic_write_json, cache_dir
from acbench.core.errors import UserError

from acbench.core.errors import DataError
from acbench.core.io import read_user_text

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


# whether a parse may be written to the cache folder: the CLI's runs do; a Python call writes nothing the caller did
# not ask for (acbench.api sets it off for its duration), and keeps the parse in this process instead
WRITES_DATA_CACHE: ContextVar[bool] = ContextVar("WRITES_DATA_CACHE", default=True)
SHOWS_PARSE_BAR: ContextVar[bool] = ContextVar("SHOWS_PARSE_BAR", default=True)  # off in a call made quiet
_PARSED: list[list[dict]] = []


def wiki_articles(progress: bool = True) -> list[dict]:
    """[{title, text}] parsed once from gensim's dump and cached (markup stripped with mwparserfromhell)."""
    cached = cache_dir() / "data" / "enwiki_gensim_articles.json"
    if cached.exists():
        return json.loads(cached.read_text())
    if _PARSED:
        return _PARSED[0]
    from tqdm.auto import tqdm

    path = _gensim_dump()
    with bz2.open(path) as f:
        root = ET.parse(f).getroot()
    ns = root.tag.split("}")[0] + "}" if root.tag.startswith("{") else ""
    pages = root.findall(f"{ns}page")
    articles = []
    for page in tqdm(pages, desc="strip wiki markup (once)",
                     disable=not (progress and SHOWS_PARSE_BAR.get())):
        title = page.findtext(f"{ns}title") or ""
        text = page.findtext(f"{ns}revision/{ns}text") or ""
        if page.find(f"{ns}redirect") is not None or text.lstrip().upper().startswith("#REDIRECT"):
            continue
        body = _strip(text)
        if len(body.split()) >= 50:
            articles.append({"title": title, "text": body})
    if WRITES_DATA_CACHE.get():
        atomic_write_json(cached, articles)
    else:
        _PARSED[:] = [articles]
    return articles


def is_eval_article(title: str) -> bool:
    return int(hashlib.sha1(title.encode()).hexdigest(), 16) % EVAL_EVERY == 0


def wiki_split(part: str) -> str:
    """'calib' or 'eval': articles never appear in both."""
    arts = [a for a in wiki_articles() if is_eval_article(a["title"]) == (part == "eval")]
    return "\n\n".join(a["text"] for a in arts)


def wikitext2(split: str) -> str:
    from datasets import load_dataset

    from acbench.core.hub import offline_unless_reachable

    with offline_unless_reachable() as offline:
        try:
            ds = load_dataset("wikitext", "wikitext-2-raw-v1", split=split)
        except Exception as e:
            why = f"{offline}, and it is not in the local datasets cache" if offline else type(e).__name__
            raise UserError(f"WikiText-2 is not reachable ({why}): use the embedded text (wiki) "
                            "or a local file (file:<path>)") from None
    return "\n\n".join(ds["text"])


# C4 as SparseGPT's and Wanda's code read it (datautils.get_c4, lib/data.py): the first shard of the English train
# split for calibration, and the first 1,100 documents of the first validation shard for evaluation
C4_FILES = {"calib": "en/c4-train.00000-of-01024.json.gz", "eval": "en/c4-validation.00000-of-00008.json.gz"}
C4_EVAL_DOCS = 1100


def c4(part: str) -> str:
    from datasets import load_dataset

    from acbench.core.hub import offline_unless_reachable

    with offline_unless_reachable() as offline:
        try:
            ds = load_dataset("allenai/c4", data_files={"train": C4_FILES[part]}, split="train")
        except Exception as e:
            why = f"{offline}, and it is not in the local datasets cache" if offline else type(e).__name__
            raise UserError(f"C4 ({C4_FILES[part]}) is not reachable ({why}): use the embedded text (wiki) or a "
                            "local file (file:<path>)") from None
    texts = ds["text"]
    return "\n\n".join(texts[:C4_EVAL_DOCS] if part == "eval" else texts)


TEXT_SOURCES = ("wiki", "wikitext2", "c4")


def load_text(source: str, part: str) -> str:
    """source: 'wiki' (embedded, split by article), 'wikitext2' or 'c4' (hub) or 'file:<path>'."""
    if source == "wiki":
        return wiki_split(part)
    if source == "wikitext2":
        return wikitext2("train" if part == "calib" else "test")
    if source == "c4":
        return c4(part)
    if source.startswith("file:"):
        if not source[5:]:
            raise UserError("text source 'file:' names no file: pass file:<path to a UTF-8 text file>")
        path = Path(source[5:]).expanduser()
        text = read_user_text(path, "text file")
        if not re.search(r"[^\W\d_]{2,}", text):  # not one word of two letters: not text to score
            raise DataError(path, None, "no words in it (empty, or not natural-language text): pass a text file")
        return text
    if Path(source).expanduser().exists():
        raise UserError(f"text source '{source}' is a path: write it as file:{source}")
    raise UserError(f"text source '{source}' is unknown: use wiki, wikitext2, c4 or file:<path>")


BOS_PROTOCOLS = ("window", "stream", "none")


def default_bos(tokenizer) -> str:
    """`window` when the tokenizer puts BOS in front of text by default (Gemma, Llama), else `none`."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return "none"
    ids = tokenizer("a", add_special_tokens=True).input_ids
    return "window" if len(ids) and ids[0] == bos else "none"


def resolve_bos(tokenizer, bos: str | None) -> str:
    """The BOS protocol to use: an explicit one is checked against the tokenizer, `auto`/None picks the default."""
    if bos in (None, "auto"):
        return default_bos(tokenizer)
    if bos not in BOS_PROTOCOLS:
        raise UserError(f"bos protocol '{bos}' is unknown: use {', '.join(BOS_PROTOCOLS)} or auto")
    if bos != "none" and getattr(tokenizer, "bos_token_id", None) is None:
        raise UserError(f"--bos {bos} asked for, but this tokenizer has no BOS token: use --bos none")
    return bos


_ENCODED: dict[tuple[str, str], torch.Tensor] = {}  # (tokenizer digest, text digest) -> token ids; a few texts
_ENCODED_MAX = 4


_LOCATION_KWARGS = frozenset({"name_or_path", "is_local", "local_files_only", "vocab_file", "merges_file",
                               "tokenizer_file", "cache_dir"})


def _tokenizer_digest(tokenizer) -> str | None:
    """What decides a fast tokenizer's ids for a text without special tokens: its class, its settings and its whole
    backend (vocabulary, merges, normalizer, pre-tokenizer), hashed; None for a tokenizer without a backend."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    # where the tokenizer was read from decides nothing: the same tokenizer saved in two folders encodes alike
    settings = repr(sorted((k, repr(v)) for k, v in getattr(tokenizer, "init_kwargs", {}).items()
                           if k not in _LOCATION_KWARGS))
    return hashlib.sha256(f"{type(tokenizer).__qualname__}\n{settings}\n{backend.to_str()}".encode()).hexdigest()


def _encode(tokenizer, text: str) -> torch.Tensor:
    """The text's token ids, encoded once per process for a tokenizer and text: the checks before a run, the run,
    its analyses and every command of one process (the tests') read the same stream instead of encoding the whole
    calibration or evaluation text again (2.5 s for the embedded calibration text on 2 cores)."""
    digest = _tokenizer_digest(tokenizer)
    key = (digest, hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()) if digest else None
    if key in _ENCODED:
        return _ENCODED[key].clone()
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[0]
    if key:
        while len(_ENCODED) >= _ENCODED_MAX:
            _ENCODED.pop(next(iter(_ENCODED)))
        _ENCODED[key] = ids.clone()
    return ids


def text_ids(tokenizer, text: str, bos: str) -> torch.Tensor:
    """The token stream of a text; under the `stream` protocol one BOS opens it (GPTQ / SVD-LLM)."""
    ids = _encode(tokenizer, text)
    if bos == "stream":
        ids = torch.cat([torch.tensor([tokenizer.bos_token_id]), ids])
    return ids


def _with_window_bos(tokenizer, rows: torch.Tensor, bos: str) -> torch.Tensor:
    """Under `window`, every window is [BOS] + (seq_len - 1) text tokens; position 0 is never a target."""
    if bos != "window":
        return rows
    return torch.cat([torch.full((rows.shape[0], 1), tokenizer.bos_token_id, dtype=rows.dtype), rows], dim=1)


def sample_text_windows(tokenizer, text: str, samples: int, seq_len: int, seed: int, bos: str = "none") -> torch.Tensor:
    """`samples` random windows of `seq_len` tokens from the calibration text (seeded), under a BOS protocol."""
    if seq_len < 2:
        raise UserError(f"--calib-seq-len {seq_len} leaves no next-token target: use at least 2 (e.g. 256)")
    ids = text_ids(tokenizer, text, bos)
    span = seq_len - 1 if bos == "window" else seq_len
    if len(ids) < span + 1:
        raise UserError(f"calibration text has {len(ids)} tokens, fewer than --calib-seq-len {seq_len}: "
                        "use shorter windows or more text")
    if samples * span > len(ids):  # the windows must overlap: the statistics hold fewer distinct tokens than asked
        import sys

        sys.stderr.write(f"calibration: {samples} windows of {seq_len} tokens ask for {samples * span} tokens of a "
                         f"text of {len(ids)}: they overlap, each token about {samples * span / len(ids):.1f} times "
                         "on average; pass a longer --calib-source, or fewer --calib-samples\n")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - span, (samples,), generator=gen)
    rows = torch.stack([ids[s:s + span] for s in starts.tolist()])
    return _with_window_bos(tokenizer, rows, bos)


def evaluation_windows(tokenizer, text: str, seq_len: int, max_windows: int | None, bos: str = "none") -> torch.Tensor:
    """Non-overlapping windows of seq_len tokens tiling the text stream (the tail shorter than a window is dropped,
    so no window crosses the end of the text); under `window` each is [BOS] + seq_len - 1 text tokens."""
    if seq_len < 2:
        raise UserError(f"--ppl-seq-len {seq_len} leaves no scored token: use at least 2 (e.g. 256)")
    ids = text_ids(tokenizer, text, bos)
    span = seq_len - 1 if bos == "window" else seq_len
    n = len(ids) // span
    if max_windows:
        n = min(n, max_windows)
    if n == 0:
        raise UserError(f"the evaluation text has {len(ids)} tokens, fewer than one window of {seq_len}: "
                        "use more text or a smaller --ppl-seq-len")
    return _with_window_bos(tokenizer, ids[: n * span].view(n, span), bos)


def sliding_windows(tokenizer, text: str, seq_len: int, scored: int, max_windows: int | None,
                    bos: str = "none") -> torch.Tensor:
    """Windows of seq_len tokens that advance by `scored` tokens through the text stream, each scored on its last
    `scored` tokens only, so that every scored token sees seq_len - scored tokens of context before it (TEAL's
    protocol: 2,048 of context, 512 scored); the first seq_len - scored tokens of the text are context only.
    Under `window` each is [BOS] + seq_len - 1 text tokens."""
    if not 1 <= scored < seq_len:
        raise UserError(f"ppl-token scored {scored}: score between 1 and seq_len - 1 ({seq_len - 1}) tokens of each "
                        "window, e.g. seq_len=2560 scored=512")
    ids = text_ids(tokenizer, text, bos)
    span = seq_len - 1 if bos == "window" else seq_len
    n = (len(ids) - span) // scored + 1 if len(ids) >= span else 0
    if max_windows:
        n = min(n, max_windows)
    if n <= 0:
        raise UserError(f"the evaluation text has {len(ids)} tokens, fewer than one window of {seq_len}: "
                        "use more text or a smaller --ppl-seq-len")
    rows = torch.stack([ids[i * scored: i * scored + span] for i in range(n)])
    return _with_window_bos(tokenizer, rows, bos)
