"""Speculation's oracle: the same requests decoded plainly, choice by choice and logprob by logprob."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.config import SpeculativeConfig
from pipeline.engine import LLMEngine
from tests.support.engine_helpers import make_engine, run_requests


def compare_with_plain(model_dir: Path, speculative: SpeculativeConfig, requests: dict[str, Any],
                       **engine_args: Any) -> tuple[LLMEngine, dict[str, dict]]:
    """Run `requests` with and without `speculative`; assert the same tokens, finish reasons, text and
    logprobs (token, rank, top ids; values within 1e-4); return the speculating engine and its results.
    The plain engine is batch-invariant, as a speculating one always is (no AMX products for many rows)."""
    plain = run_requests(make_engine(model_dir, batch_invariant=True, **engine_args), requests)
    engine = make_engine(model_dir, speculative=speculative, **engine_args)
    speculating = run_requests(engine, requests)
    for request_id in requests:
        for index, choice in plain[request_id]["choices"].items():
            other = speculating[request_id]["choices"][index]
            label = f"{request_id}[{index}]"
            assert other["token_ids"] == choice["token_ids"], label
            assert other["finish_reason"] == choice["finish_reason"], label
            assert other["text"] == choice["text"], label
            assert len(other["logprobs"]) == len(choice["logprobs"]), label
            for ours, theirs in zip(other["logprobs"], choice["logprobs"], strict=True):
                assert ours.token_id == theirs.token_id and ours.rank == theirs.rank, label
                assert ours.logprob == pytest.approx(theirs.logprob, abs=1e-4), label
                assert [t for t, _ in ours.top] == [t for t, _ in theirs.top], label
    return engine, speculating
