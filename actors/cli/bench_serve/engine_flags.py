"""The engine flags a command was given, written back as a command line for `aqueduct serve`.

`aqueduct bench --serve --dtype bfloat16 --quantization none` must start the server with those
flags, and no others: each engine flag whose parsed value differs from its default is rendered
again, so the server runs at its own defaults unless the bench command said otherwise.
"""

from __future__ import annotations

import argparse

from actors.cli.engine_args import add_engine_args


def given_engine_flags(args: argparse.Namespace, skip: frozenset[str] = frozenset()) -> list[str]:
    """The engine flags in `args` that differ from their defaults, except the destinations in `skip`."""
    parser = argparse.ArgumentParser(add_help=False)
    add_engine_args(parser)
    flags: list[str] = []
    seen: set[str] = set()
    for action in parser._actions:  # argparse has no public list of its actions
        if action.dest in skip or action.dest in seen or not action.option_strings:
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default:
            continue
        seen.add(action.dest)
        flags += _render(action, value)
    return flags


def _render(action: argparse.Action, value: object) -> list[str]:
    option = action.option_strings[0]
    if isinstance(action, argparse.BooleanOptionalAction):
        return [option if value else f"--no-{option.removeprefix('--')}"]
    if action.nargs == 0:  # store_true / store_false: the flag alone flips its default
        return [option]
    if isinstance(value, list | tuple):
        return [option, *map(str, value)]
    return [option, str(value)]
