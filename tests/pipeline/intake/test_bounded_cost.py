"""No request's parameters may cost the others a stalled step: list sizes are bounded, a DRY
breaker mask is built at intake (not on the device thread), a prompt that cannot fit is refused
before the tokenizer sees it."""

from __future__ import annotations

import pytest

from pipeline.intake.request_builder import MAX_CHARS_PER_TOKEN, RequestBuilder
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
        builder.build("r2", SamplingParams(max_tokens=4), prompt="x" * (32 * MAX_CHARS_PER_TOKEN + 1))
    assert tokenizer.calls == 0
