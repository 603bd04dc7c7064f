"""No request's parameters may cost the others a stalled step: list sizes are bounded, a DRY
breaker mask is built at intake (not on the device thread), a prompt that cannot fit is refused
before the tokenizer sees it."""

from __future__ import annotations

import pytest

from pipeline.config import RequestLimits
from pipeline.intake.request_builder import RequestBuilder
from pipeline.request.sampling_params import LIST_LIMITS, SamplingParams
from pipeline.sampling.dry import SequenceBreakers


@pytest.mark.parametrize(("name", "most_items", "longest"), LIST_LIMITS)
def test_list_parameters_are_bounded_in_count_and_length(name: str, most_items: int, longest: int | None) -> None:
    def items(count: int, length: int = 1) -> object:
        if name == "logit_bias":
            return {str(i): 1.0 for i in range(count)}
        return [f"{i:0{length}d}" for i in range(count)] if longest is not None else list(range(count))

    SamplingParams(**{name: items(most_items)})
    with pytest.raises(ValueError, match=f"{name} may hold at most {most_items} items"):
        SamplingParams(**{name: items(most_items + 1)})
    if longest is not None:
        SamplingParams(**{name: items(1, longest)})
        with pytest.raises(ValueError, match=f"{name} items may be at most {longest} characters"):
            SamplingParams(**{name: items(1, longest + 1)})


class _CountingTokenizer:
    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.calls += 1
        return [1] * max(1, len(text) // 4)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return ["a", "b:", "c\n", "dd"][token_ids[0]]


def test_the_breaker_mask_is_built_at_intake_and_a_long_prompt_is_refused_untokenized() -> None:
    tokenizer = _CountingTokenizer()
    breakers = SequenceBreakers(tokenizer.decode, 4)
    builder = RequestBuilder(tokenizer, 4, frozenset({0}), max_model_len=32, breakers=breakers)
    params = SamplingParams(max_tokens=4, dry_multiplier=0.8, dry_sequence_breakers=[":", "\n", "zz"])
    builder.build("r1", params, prompt="hello")
    assert breakers._masks[frozenset([":", "\n", "zz"])].tolist() == [False, True, True, False]
    tokenizer.calls = 0
    with pytest.raises(ValueError, match="characters; at most"):
        builder.build("r2", SamplingParams(max_tokens=4), prompt="x" * (32 * 64 + 1))
    assert tokenizer.calls == 0


def test_a_deployment_lowers_the_request_limits_with_flags() -> None:
    from actors.cli.engine_args import engine_config_from_args
    from actors.cli.main import build_parser

    args = build_parser().parse_args(["worker", "--max-stop-strings", "2", "--max-dry-breakers", "1",
                                      "--max-logit-bias", "3", "--max-token-bans", "0",
                                      "--max-prompt-chars-per-token", "2"])
    limits = engine_config_from_args(args).limits
    assert limits == RequestLimits(2, 1, 3, 0, 2)
    builder = RequestBuilder(_CountingTokenizer(), 4, frozenset({0}), max_model_len=32, limits=limits)
    builder.build("ok", SamplingParams(max_tokens=4, stop=["a", "b"], logit_bias={1: 1.0}), prompt="hi")
    for params, message in (
            (SamplingParams(max_tokens=4, stop=["a", "b", "c"]), r"stop may hold at most 2 .*--max-stop-strings"),
            (SamplingParams(max_tokens=4, dry_multiplier=0.8), r"dry_sequence_breakers .*--max-dry-breakers"),
            (SamplingParams(max_tokens=4, logit_bias={1: 1.0, 2: 1.0, 3: 1.0, 0: 1.0}), "--max-logit-bias"),
            (SamplingParams(max_tokens=4, custom_token_bans=[1]), "--max-token-bans")):
        with pytest.raises(ValueError, match=message):
            builder.build("r", params, prompt="hi")
    with pytest.raises(ValueError, match="--max-prompt-chars-per-token"):
        builder.build("long", SamplingParams(max_tokens=4), prompt="x" * 65)
    with pytest.raises(ValueError, match="max_stop_strings must be in"):
        RequestLimits(max_stop_strings=65)
