"""Scenarios the sliding-window families (Gemma 2/3/4, gpt-oss) are each checked against HF with:
prompts around the window then decodes that cross it, and chunks longer than the window over cached
context (the `decode_path` fixture, in conftest.py beside the family tests, runs a test with the
native decode kernel and without)."""

from __future__ import annotations

from pipeline.model.runner import ModelRunner
from tests.pipeline.model.test_model_forward import Reference, Seqs, run_and_check


def check_decode_path(runner: ModelRunner, decode_path: str) -> ModelRunner:
    assert (runner.backend.decode_kernel is not None) == (decode_path == "kernel")
    return runner


def check_across_the_window(runner: ModelRunner, reference: Reference, window: int, num_decodes: int) -> None:
    """Prompts shorter than, equal to, one past and far past the window (1 is decode-shaped); then
    decodes, in which the window-1 sequence crosses the window."""
    seqs = Seqs(runner.block_size, seed=3)
    lengths = [1, window - 1, window, window + 1, 45, 70]
    run_and_check(runner, seqs, reference, [(seqs.add(n), n) for n in lengths])
    for _ in range(num_decodes):
        for seq in range(len(lengths)):
            seqs.append_token(seq)
        run_and_check(runner, seqs, reference, [(seq, 1) for seq in range(len(lengths))])


def check_chunks_over_cached_context(runner: ModelRunner, reference: Reference, num_decodes: int = 0,
                                     num_padding: int = 0) -> None:
    """A 57-token prompt in chunks of 13, 21 and 23 (longer than the windows), each after cached
    context and beside a decode; then decodes of both."""
    seqs = Seqs(runner.block_size, seed=4)
    long_prompt, short = seqs.add(57), seqs.add(6)
    run_and_check(runner, seqs, reference, [(long_prompt, 13), (short, 6)])
    for chunk in (21, 23):
        seqs.append_token(short)
        run_and_check(runner, seqs, reference, [(short, 1), (long_prompt, chunk)], num_padding=num_padding)
    for _ in range(num_decodes):
        for seq in (long_prompt, short):
            seqs.append_token(seq)
        run_and_check(runner, seqs, reference, [(long_prompt, 1), (short, 1)])
