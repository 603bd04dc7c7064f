"""--speculative-config (vLLM's form) and Aphrodite's --speculative-model ([ngram] or a draft model) flags
on every engine command."""

from __future__ import annotations

import pytest

from actors.cli.engine_args import speculative_config_from_args
from actors.cli.main import build_parser
from pipeline.config import SpeculativeConfig


def _parse(*flags: str, command: str = "worker"):
    extra = ["-i", "in.jsonl", "-o", "out.jsonl"] if command == "batch" else []
    return speculative_config_from_args(build_parser().parse_args([command, *extra, *flags]))


@pytest.mark.parametrize("command", ["worker", "serve", "batch"])
def test_both_forms_give_the_same_config(command):
    vllm = _parse("--speculative-config",
                  '{"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 5, "prompt_lookup_min": 2, '
                  '"disable_by_batch_size": 3}', command=command)
    aphrodite = _parse("--speculative-model", "[ngram]", "--num-speculative-tokens", "6",
                       "--ngram-prompt-lookup-max", "5", "--ngram-prompt-lookup-min", "2",
                       "--speculative-disable-by-batch-size", "3", command=command)
    assert vllm == aphrodite == SpeculativeConfig("ngram", 6, 5, 2, 3)
    assert _parse(command=command) is None


@pytest.mark.parametrize("command", ["worker", "serve", "batch"])
def test_a_draft_model_in_both_forms(command):
    vllm = _parse("--speculative-config", '{"model": "draft.gguf", "num_speculative_tokens": 3}', command=command)
    aphrodite = _parse("--speculative-model", "draft.gguf", "--num-speculative-tokens", "3", command=command)
    assert vllm == aphrodite == SpeculativeConfig(method="draft_model", num_speculative_tokens=3, model="draft.gguf")


@pytest.mark.parametrize(("flags", "message"), [
    (["--speculative-config", "{not json"], "--speculative-config: not valid JSON"),
    (["--speculative-model", "/models/draft", "--ngram-prompt-lookup-max", "3"],
     "prompt_lookup_max apply to prompt lookup only"),
    (["--num-speculative-tokens", "3"], "--num-speculative-tokens needs --speculative-model"),
    (["--speculative-config", '{"method": "ngram"}', "--num-speculative-tokens", "3"], "give it alone"),
    (["--speculative-model", "[ngram]", "--ngram-prompt-lookup-min", "0"], "prompt_lookup_min must be >= 1"),
])
def test_bad_flags_are_errors_that_name_them(flags, message):
    with pytest.raises(ValueError, match=message):
        _parse(*flags)
