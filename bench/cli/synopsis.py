"""The CLI's synopsis, generated from its argument parser: every subcommand with every flag, so the README's copy
cannot drift from what the commands accept (tests/readme_numbers.py writes it into the README; a test checks it)."""

from __future__ import annotations

import argparse
import textwrap

COMMAND_WIDTH = 19  # "bench check-method " and a space: every command's flags start in one column


def _flag(action: argparse.Action) -> str:
    """One option as the synopsis shows it: `--flag`, `--flag X`, `--flag X...` or `--flag {a,b}`; optional ones in
    brackets."""
    name = max(action.option_strings, key=len)
    if action.nargs == 0:
        text = name
    else:
        value = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else "X"
        text = f"{name} {value}" + ("..." if action.nargs in ("+", "*") else "")
    return text if action.required else f"[{text}]"


def _positional(action: argparse.Action) -> str:
    if action.choices:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest.upper() + ("..." if action.nargs in ("+", "*") else "")


def command_line(name: str, parser: argparse.ArgumentParser, width: int) -> str:
    """`bench <name>` and its arguments, wrapped at `width` with continuation lines under the first flag."""
    parts = [_positional(a) for a in parser._actions if not a.option_strings]
    parts += [_flag(a) for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    head = f"bench {name}".ljust(COMMAND_WIDTH - 1)
    glued = " ".join(p.replace(" ", "\0") for p in parts)  # a line breaks between arguments, never inside one
    return textwrap.fill(glued, width=width, initial_indent=head + " ", subsequent_indent=" " * COMMAND_WIDTH,
                         break_on_hyphens=False, break_long_words=False).replace("\0", " ")


def synopsis(width: int = 118) -> str:
    """Every subcommand of `bench`, in the parser's order, one wrapped entry each."""
    from acbench.cli import _parser

    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return "\n".join(command_line(name, p, width) for name, p in sub.choices.items())
