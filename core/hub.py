"""Whether the Hugging Face hub can be reached, asked once per process before anything downloads.

huggingface_hub retries an unreachable host five times with backoff (about 30 s of "Retrying in 8s" lines) before
transformers or datasets give up. One connection attempt with a short timeout answers the same question; where it
fails, the download runs in offline mode, so what the local caches hold still loads and a miss fails at once; the
libraries' offline flags are put back after it.
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from urllib.parse import urlparse

PROBE_TIMEOUT_S = 3.0
_TRUE = {"1", "ON", "YES", "TRUE"}
_answer: list[str | None] = []
ENV_FLAGS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def unreachable_why() -> str | None:
    """None if the hub answers a connection; else why not (offline mode set by the user, or the failed probe)."""
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE:
        return "HF_HUB_OFFLINE is set"
    if not _answer:
        url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
        host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
        try:
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
            _answer.append(None)
        except OSError as e:
            _answer.append(f"{host} cannot be reached from this machine ({e.strerror or type(e).__name__})")
    return _answer[0]


@contextmanager
def offline_unless_reachable():
    """Around a hub download: where the hub cannot be reached, huggingface_hub, transformers and datasets are in
    offline mode within (cached files only, no retry loop), and their flags (the environment variables and the
    libraries' own constants) are put back on the way out. Yields why the hub is unreachable, or None."""
    why = unreachable_why()
    if why is None:
        yield None
        return
    import huggingface_hub.constants as hub_constants

    flags = [(hub_constants, "HF_HUB_OFFLINE")]  # read at call time; the environment only at import
    try:
        import datasets.config as datasets_config

        flags += [(datasets_config, "HF_HUB_OFFLINE"), (datasets_config, "HF_DATASETS_OFFLINE")]
    except ImportError:
        pass
    env = {k: os.environ.get(k) for k in ENV_FLAGS}
    values = [(module, name, getattr(module, name)) for module, name in flags]
    os.environ.update(dict.fromkeys(ENV_FLAGS, "1"))
    for module, name in flags:
        setattr(module, name, True)
    try:
        yield why
    finally:
        for module, name, value in values:
            setattr(module, name, value)
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
