"""IncrementalDetokenizer: deltas concatenate to the full decode, never split a character."""

from __future__ import annotations

import random

import pytest

from pipeline.output.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer

MULTILINGUAL_TEXT = (
    "Café au lait, naïve façade, crème brûlée. 東京 and 京都 🍜🍙! "
    "Grüß Gott, señora. ευχαριστώ, спасибо, 감사합니다 😀🚀❤️ done."
)


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


class RecordingTokenizer:
    """Wraps a tokenizer and records how many ids each decode call received."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.decode_lengths: list[int] = []

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        self.decode_lengths.append(len(token_ids))
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


def stream(detokenizer: IncrementalDetokenizer, token_ids: list[int], chunk_sizes=None) -> list[str]:
    """Feed ids (one at a time, or in the given chunk sizes) and return every delta incl. finish()."""
    deltas = []
    position = 0
    sizes = iter(chunk_sizes or [])
    while position < len(token_ids):
        size = next(sizes, 1)
        deltas.append(detokenizer.add(token_ids[position:position + size]))
        position += size
    deltas.append(detokenizer.finish())
    return deltas


def test_multilingual_text_streams_token_by_token_without_replacement_chars(tokenizer):
    token_ids = tokenizer.encode(MULTILINGUAL_TEXT)
    deltas = stream(IncrementalDetokenizer(tokenizer), token_ids)
    assert "".join(deltas) == MULTILINGUAL_TEXT
    assert not any(REPLACEMENT_CHAR in delta for delta in deltas)


def test_character_split_over_tokens_is_emitted_only_when_complete(tokenizer):
    emoji = "🍜"
    token_ids = tokenizer.encode(emoji)
    assert len(token_ids) > 1, "the test needs an emoji that the tokenizer splits"
    detokenizer = IncrementalDetokenizer(tokenizer)
    partial = [detokenizer.add([token_id]) for token_id in token_ids[:-1]]
    assert partial == [""] * (len(token_ids) - 1)
    assert detokenizer.add(token_ids[-1:]) == emoji
    assert detokenizer.text == emoji


@pytest.mark.parametrize("skip_special_tokens", [True, False])
@pytest.mark.parametrize("id_range", [(0, 4096), (3, 259)], ids=["whole-vocab", "single-bytes"])
def test_random_token_sequences_concatenate_to_full_decode(tokenizer, skip_special_tokens, id_range):
    # Single-byte tokens (ids 3..258) produce many partial and invalid UTF-8 sequences.
    rng = random.Random(1234)
    for _ in range(200):
        token_ids = [rng.randrange(*id_range) for _ in range(rng.randrange(1, 60))]
        detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
        deltas = stream(detokenizer, token_ids)
        expected = tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)
        assert "".join(deltas) == expected
        assert detokenizer.text == expected


def test_random_chunk_sizes_give_the_same_text(tokenizer):
    rng = random.Random(99)
    token_ids = tokenizer.encode(MULTILINGUAL_TEXT * 3)
    chunk_sizes = [rng.randrange(1, 7) for _ in token_ids]
    deltas = stream(IncrementalDetokenizer(tokenizer), token_ids, chunk_sizes)
    assert "".join(deltas) == MULTILINGUAL_TEXT * 3
    assert not any(REPLACEMENT_CHAR in delta for delta in deltas)


def test_output_after_a_prompt_decodes_like_the_output_alone(tokenizer):
    prompt_ids = tokenizer.encode("The river ran to the sea and")
    output_ids = tokenizer.encode(" the café by 東京 🚀 was open.")
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids=prompt_ids)
    assert "".join(stream(detokenizer, output_ids)) == tokenizer.decode(output_ids)


def test_special_tokens_are_skipped_or_kept(tokenizer):
    token_ids = [*tokenizer.encode("Hello"), tokenizer.convert_tokens_to_ids("<|im_end|>"),
                 *tokenizer.encode(" there")]
    skipped = IncrementalDetokenizer(tokenizer, skip_special_tokens=True)
    kept = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    assert "".join(stream(skipped, token_ids)) == "Hello there"
    assert "".join(stream(kept, token_ids)) == "Hello<|im_end|> there"


def test_finish_flushes_an_incomplete_character_as_the_tokenizer_decodes_it(tokenizer):
    all_ids = tokenizer.encode(MULTILINGUAL_TEXT)
    # Cut the ids right after the first token that ends mid-character.
    cut = next(end for end in range(1, len(all_ids) + 1)
               if tokenizer.decode(all_ids[:end]).endswith(REPLACEMENT_CHAR))
    token_ids = all_ids[:cut]
    detokenizer = IncrementalDetokenizer(tokenizer)
    streamed = "".join(detokenizer.add([token_id]) for token_id in token_ids)
    assert REPLACEMENT_CHAR not in streamed
    tail = detokenizer.finish()
    assert streamed + tail == tokenizer.decode(token_ids)
    assert tail.endswith(REPLACEMENT_CHAR)


def test_decode_window_stays_small_for_long_outputs(tokenizer):
    recorder = RecordingTokenizer(tokenizer)
    token_ids = tokenizer.encode(MULTILINGUAL_TEXT * 40)
    deltas = stream(IncrementalDetokenizer(recorder), token_ids)
    assert "".join(deltas) == MULTILINGUAL_TEXT * 40
    assert len(token_ids) > 1000
    assert max(recorder.decode_lengths) <= 12


def test_invalid_bytes_do_not_grow_the_window(tokenizer):
    # "Ģ" is the byte-level symbol for byte 0x80: a lone continuation byte never completes.
    continuation_byte = tokenizer.convert_tokens_to_ids("Ģ")
    assert tokenizer.decode([continuation_byte]) == REPLACEMENT_CHAR
    token_ids = [continuation_byte] * 200 + tokenizer.encode(" fine")
    recorder = RecordingTokenizer(tokenizer)
    deltas = stream(IncrementalDetokenizer(recorder), token_ids)
    assert "".join(deltas) == tokenizer.decode(token_ids)
    assert max(recorder.decode_lengths) <= 12


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_partial_character_before_special_tokens_costs_few_decodes_per_id(tokenizer, skip_special_tokens):
    """A lone lead byte, then ids that decode to nothing (skipped EOS, as under ignore_eos): the text
    keeps ending in U+FFFD with nothing to seal. Each id costs a bounded number of decodes (the
    sealed-part search once tried every split: 180k decodes for 600 ids), and the text still ends
    as the tokenizer decodes it."""
    lead_byte = tokenizer.convert_tokens_to_ids("â")  # the byte-level symbol for 0xE2, a 3-byte lead
    eos = tokenizer.eos_token_id
    token_ids = tokenizer.encode("Hi") + [lead_byte] + [eos] * 600 + tokenizer.encode(" fine")
    recorder = RecordingTokenizer(tokenizer)
    detokenizer = IncrementalDetokenizer(recorder, skip_special_tokens=skip_special_tokens)
    deltas = stream(detokenizer, token_ids)
    assert "".join(deltas) == tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)
    assert len(recorder.decode_lengths) <= 12 * len(token_ids)


def test_empty_add_returns_empty_string(tokenizer):
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert detokenizer.add([]) == ""
    assert detokenizer.finish() == ""
    assert detokenizer.text == ""


def test_fast_decoder_gives_the_tokenizers_text(default_model_path):
    from transformers import AutoTokenizer

    from pipeline.output.detokenizer import fast_decoder

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    fast = fast_decoder(tokenizer)
    assert fast is not tokenizer  # the backend path is taken for this tokenizer
    rng = random.Random(3)
    for _ in range(200):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 12))]
        for skip in (True, False):
            assert fast.decode(ids, skip_special_tokens=skip) == tokenizer.decode(ids, skip_special_tokens=skip)
