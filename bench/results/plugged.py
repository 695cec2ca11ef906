"""Subcommands that plug into `bench` from above the harness: a study's own command (`bench emerge`).

The CLI sits in bench/, below the studies that drive whole sweeps, so it cannot import them. A study declares its
command as an entry point of the group `acbench.commands`, naming a `Command` (as methods and tasks plug in through
`acbench.methods` and `acbench.tasks`); the CLI adds each to its parser, runs it, renders the cells it stores with
its report sections, and refuses its name as a task of `bench run`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import entry_points

from acbench.core.log import warn
from acbench.core.registry import load_entry_point

GROUP = "acbench.commands"


@dataclass(frozen=True)
class Command:
    name: str  # the subcommand: `bench <name>`
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]  # its exit status; a UserError is one line, as for every command
    # {cell task: section renderer} for the summary cells the command stores (the leaderboard renders them)
    report_sections: Callable[[], dict] = field(default=dict)


@cache
def plugged_commands() -> dict[str, Command]:
    """{name: Command} of every installed `acbench.commands` entry point, by name."""
    out = {}
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        # a command that does not import is one warning line; every other command stays usable
        command, problem = load_entry_point(ep, lambda c: isinstance(c, Command), "a acbench.results.plugged.Command")
        if problem:
            warn(f"command plugin skipped: {problem}")
            continue
        out[command.name] = command
    return out


def report_sections() -> dict:
    """The section renderers of every plugged command's summary cells."""
    return {task: render for c in plugged_commands().values() for task, render in c.report_sections().items()}
