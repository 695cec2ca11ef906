"""The brute-force reference of LAMA's candidate scorer (acbench.tasks.lama.score_probes), for the tests and benchmarks."""

from __future__ import annotations

import torch

from acbench.tasks.base import model_device


@torch.no_grad()
def score_candidates_reference(model, tokenizer, prompt: str, cands: list[list[int]]) -> torch.Tensor:
    """Brute force: one full forward per candidate, full log-softmax over every position."""
    p = tokenizer.encode(prompt)
    device = model_device(model)
    out = []
    for c in cands:
        ids = torch.tensor([p + c], device=device)
        logp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0].double(), -1)  # float64 reference
        out.append(sum(logp[len(p) - 1 + i, t].item() for i, t in enumerate(c)))
    return torch.tensor(out)
