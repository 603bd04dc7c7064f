"""`aqueduct serve`'s Batch API flags: their defaults, their values in the gateway's options, and a bound below 1
refused naming the flag."""

from __future__ import annotations

import argparse

import pytest

from actors.http.options import BatchOptions
from actors.http.serve_args import add_batch_args, batch_options_from_args


def _parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_batch_args(parser)
    return parser.parse_args(argv)


def test_the_defaults_are_the_options_defaults() -> None:
    assert batch_options_from_args(_parsed()) == BatchOptions()


def test_the_flags_set_the_bounds() -> None:
    options = batch_options_from_args(_parsed("--batch-max-file-bytes", "1000", "--batch-max-lines", "5",
                                              "--batch-max-in-flight", "3", "--batch-max-running", "2"))
    assert (options.max_file_bytes, options.max_lines, options.max_in_flight, options.max_running) == (1000, 5, 3, 2)
    assert options.max_lines_in_flight == 6  # what the gateway's Redis pool makes room for


def test_a_bound_below_one_is_refused_naming_its_flag() -> None:
    with pytest.raises(ValueError, match="--batch-max-in-flight must be >= 1"):
        batch_options_from_args(_parsed("--batch-max-in-flight", "0"))
