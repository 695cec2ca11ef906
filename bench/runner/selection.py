"""Which input groups a variant compresses: `--groups` (group kinds) and `--blocks` (block indices and ranges).

The selection is one canonical string, the cell's `scope` ("all", or e.g. "groups=mlp_in,mlp_out;blocks=0-5,12"),
so two runs that select the same groups in another spelling share their cells.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from acbench.core.errors import UserError, did_you_mean
from acbench.core.record import ALL_GROUPS as ALL

from acbench.model.groups import GROUP_KINDS, InputGroup


MAX_BLOCK = 100_000  # far past the deepest model's block count; a larger index is a typo


def parse_blocks(text: str) -> tuple[int, ...]:
    """'0-5,12' -> (0, 1, 2, 3, 4, 5, 12)."""
    out: set[int] = set()
    for part in str(text).replace(" ", "").split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise UserError(f"--blocks '{text}': '{part}' is not a block index or an ascending range; use e.g. "
                            "--blocks 0-5,12")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi > MAX_BLOCK:  # before a range of a billion indices is built in memory
            raise UserError(f"--blocks '{text}': block {hi} is past any model's blocks (at most {MAX_BLOCK}); use "
                            "the model's block indices, e.g. --blocks 0-5,12")
        out.update(range(lo, hi + 1))
    return tuple(sorted(out))


def format_blocks(blocks) -> str:
    """(0, 1, 2, 5) -> '0-2,5'."""
    parts, run = [], []
    for b in sorted(blocks):
        if run and b != run[-1] + 1:
            parts.append(run)
            run = []
        run.append(b)
    if run:
        parts.append(run)
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in parts)


def check_kinds(kinds) -> None:
    for k in kinds:
        if k not in GROUP_KINDS:
            raise UserError(f"--groups: unknown group kind '{k}'.{did_you_mean(k, GROUP_KINDS)} The kinds are "
                            f"{', '.join(GROUP_KINDS)}.")


@dataclass(frozen=True)
class Selection:
    kinds: tuple[str, ...] | None = None  # None: every kind
    blocks: tuple[int, ...] | None = None  # None: every block

    @classmethod
    def from_flags(cls, groups: list[str] | None, blocks: str | None) -> "Selection":
        if groups is not None:
            if not groups:
                raise UserError(f"--groups is empty: name group kinds ({', '.join(GROUP_KINDS)}) or leave it out")
            check_kinds(groups)
        return cls(kinds=None if groups is None else tuple(k for k in GROUP_KINDS if k in groups),
                   blocks=None if blocks is None else parse_blocks(blocks))

    def resolve(self, n_blocks: int, kinds_present: tuple[str, ...] | None = None) -> "Selection":
        """Checked against the model (its block count, and the group kinds it has where given); a selection of
        everything is the default selection (same scope, same cells)."""
        if self.kinds is not None and kinds_present is not None:
            if not set(self.kinds) & set(kinds_present):
                raise UserError(f"--groups {','.join(self.kinds)}: this model has no such groups; its kinds are "
                                f"{', '.join(kinds_present)}")
            if set(self.kinds) >= set(kinds_present):
                return Selection(None, self.blocks).resolve(n_blocks)
            # the kinds this model has: the scope names what is compressed
            return Selection(tuple(k for k in self.kinds if k in kinds_present), self.blocks).resolve(n_blocks)
        if self.blocks is not None:
            outside = [b for b in self.blocks if b >= n_blocks]
            if outside:
                raise UserError(f"--blocks {format_blocks(self.blocks)}: block {outside[0]} does not exist, the model "
                                f"has {n_blocks} blocks (0-{n_blocks - 1})")
        kinds = None if self.kinds is not None and set(self.kinds) == set(GROUP_KINDS) else self.kinds
        blocks = None if self.blocks is not None and set(self.blocks) == set(range(n_blocks)) else self.blocks
        return Selection(kinds, blocks)

    def includes(self, group: InputGroup) -> bool:
        return (self.kinds is None or group.kind in self.kinds) and (self.blocks is None or group.block in self.blocks)

    @property
    def scope(self) -> str:
        parts = []
        if self.kinds is not None:
            parts.append("groups=" + ",".join(self.kinds))
        if self.blocks is not None:
            parts.append("blocks=" + format_blocks(self.blocks))
        return ";".join(parts) or ALL

