"""RequestBuilder: every bad input is a ValueError naming the problem (the caller's error reply)."""

from __future__ import annotations

import pytest
from jinja2.exceptions import TemplateError

from pipeline.intake.request_builder import RequestBuilder
from pipeline.request.sampling_params import SamplingParams


class _StrictTemplateTokenizer:
    """A tokenizer whose chat template insists on alternating roles, as many models' do."""

    chat_template = "{{ raise_exception('Conversation roles must alternate user/assistant') }}"

    def apply_chat_template(self, messages, **_kwargs):
        raise TemplateError("Conversation roles must alternate user/assistant")

    def encode(self, text):
        return [3] * len(text)


def test_a_chat_template_that_raises_is_a_bad_request_not_a_crash() -> None:
    builder = RequestBuilder(_StrictTemplateTokenizer(), vocab_size=16, eos_token_ids=frozenset({0}),
                             max_model_len=64)
    with pytest.raises(ValueError, match="chat template rejected them: Conversation roles must alternate"):
        builder.build("r", SamplingParams(), messages=[{"role": "user", "content": "a"},
                                                       {"role": "user", "content": "b"}])
    assert builder.build("ok", SamplingParams(), prompt="abc").prompt_token_ids == [3, 3, 3]


class _BosAddingTokenizer:
    """Adds BOS (id 1) unless told not to, like Llama's; its chat template writes the BOS itself."""

    chat_template = "<s>{{ messages[0]['content'] }}"

    def apply_chat_template(self, messages, **_kwargs):
        return "<s>" + messages[0]["content"]

    def encode(self, text, add_special_tokens=True):
        written_bos = [1] if text.startswith("<s>") else []
        return [1] * add_special_tokens + written_bos + [3] * len(text.removeprefix("<s>"))


def test_a_rendered_chat_prompt_is_tokenized_without_adding_special_tokens_again() -> None:
    builder = RequestBuilder(_BosAddingTokenizer(), vocab_size=16, eos_token_ids=frozenset({0}), max_model_len=64)
    chat = builder.build("c", SamplingParams(), messages=[{"role": "user", "content": "ab"}])
    assert chat.prompt_token_ids == [1, 3, 3]
    assert builder.build("t", SamplingParams(), prompt="ab").prompt_token_ids == [1, 3, 3]
