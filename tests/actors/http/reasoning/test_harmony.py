"""`--reasoning-parser gpt_oss` as a specification: harmony messages split by their channel (analysis
is reasoning, final and a commentary preamble content, a call to a function stays whole in the
content), an answer cut short anywhere, an answer that is not harmony (all content), and the same
split however the text is cut into pieces; only what may still be a marker or a header is held."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.http.reasoning import FORMATS, ReasoningSplitter, Split, decode_params, format_for_request, split_whole

GPT_OSS = FORMATS["gpt_oss"]
NEXT = "<|end|><|start|>assistant"
CALL = '<|channel|>commentary to=functions.weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>'

CASES = [
    (f"<|channel|>analysis<|message|>I add.{NEXT}<|channel|>final<|message|>4<|return|>", ("I add.", "4")),
    (f"<|channel|>analysis<|message|>I add.{NEXT}<|channel|>final<|message|>4", ("I add.", "4")),  # stop token cut
    ("<|channel|>analysis<|message|>cut short", ("cut short", None)),  # no final channel: all reasoning
    ("<|channel|>analysis<|message|>a<|end|>", ("a", None)),
    (f"<|channel|>analysis<|message|>a{NEXT}<|channel|>fin", ("a", None)),  # a header cut off goes nowhere
    ("<|channel|>analysis<|message|>a<|end|>b", ("ab", None)),  # text after an end: where the message went
    ("<|channel|>final<|message|>4<|return|>", (None, "4")),
    ("<|start|>assistant<|channel|>final<|message|>4", (None, "4")),
    (f"<|channel|>analysis<|message|>a{NEXT}<|channel|>analysis<|message|>b{NEXT}<|channel|>final<|message|>c",
     ("ab", "c")),
    (f"<|channel|>analysis<|message|>Need it.{NEXT}<|channel|>commentary<|message|>Checking.{NEXT}{CALL}",
     ("Need it.", f"Checking.<|start|>assistant{CALL}")),  # a preamble, then a call kept whole
    ('<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}',
     (None, '<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}')),
    ("<|channel|>analysis to=python code<|message|>print(1)<|call|>", ("print(1)", None)),  # not a function
    ("<|channel|>final<|message|>a <| b |> <|end", (None, "a <| b |> <|end")),  # only whole markers count
    ("<|channel|>analysis<|message|><|end|>", (None, None)),
    ("<|channel|>analy", (None, None)),
    ("It is 4.", (None, "It is 4.")),  # not harmony: all content, as written
    ("4<|end|>", (None, "4<|end|>")),
    ("<|cha", (None, "<|cha")),
    ("", (None, None)),
]
TEXTS = [text for text, _ in CASES] + ["<", "<|", "<|start|>", "<|channel|>final<|message|>a<|e", "a<|"]


@pytest.mark.parametrize(("text", "split"), CASES)
def test_the_whole_answer_splits_by_channel(text: str, split: tuple[str | None, str | None]) -> None:
    assert split_whole(GPT_OSS, text) == split


def test_a_constrained_answer_or_one_with_thinking_off_is_content_unless_harmony() -> None:
    assert format_for_request("gpt_oss", {"enable_thinking": False}, constrained=True) == GPT_OSS
    assert split_whole(GPT_OSS, '{"a": 1}') == (None, '{"a": 1}')
    off = dataclasses.replace(GPT_OSS, opening="never")
    assert split_whole(off, "<|channel|>analysis<|message|>a") == (None, "<|channel|>analysis<|message|>a")


def test_only_gpt_oss_asks_for_the_special_tokens() -> None:
    assert decode_params("gpt_oss") == {"skip_special_tokens": False, "spaces_between_special_tokens": False}
    assert decode_params("qwen3") == decode_params(None) == {}


def streamed(text: str, cuts: list[int]) -> tuple[list[Split], Split]:
    splitter = ReasoningSplitter(GPT_OSS)
    pieces = [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    outs = [splitter.feed(piece) for piece in pieces]
    outs.append(splitter.finish())
    return outs, Split("".join(out.reasoning for out in outs), "".join(out.content for out in outs))


@pytest.mark.parametrize("text", TEXTS)
def test_a_marker_cut_at_any_position_splits_the_same(text: str) -> None:
    whole = split_whole(GPT_OSS, text)
    for cut in range(1, len(text)):
        _, joined = streamed(text, [cut])
        assert (joined.reasoning or None, joined.content or None) == whole
    for first in range(1, len(text)):
        for second in range(first + 1, len(text)):
            _, joined = streamed(text, [first, second])
            assert (joined.reasoning or None, joined.content or None) == whole
    _, one_by_one = streamed(text, list(range(1, len(text))))
    assert (one_by_one.reasoning or None, one_by_one.content or None) == whole


_PIECES = st.sampled_from(["<|channel|>", "<|start|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>",
                           "<|constrain|>", "analysis", "final", "commentary", " to=functions.f", "assistant",
                           "a", " ", "<|", "|>", "<|chan", "nel|>", "json", "{}", "<"])


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(_PIECES, max_size=14), data=st.data())
def test_any_text_cut_anywhere_streams_the_whole_split(parts: list[str], data: st.DataObject) -> None:
    text = "".join(parts)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(len(text) - 1, 1)), max_size=8))))
    _, joined = streamed(text, [cut for cut in cuts if cut < len(text)])
    assert (joined.reasoning or None, joined.content or None) == split_whole(GPT_OSS, text)


def test_only_what_may_be_a_marker_or_a_header_is_held() -> None:
    splitter = ReasoningSplitter(GPT_OSS)
    assert splitter.feed("<|chan") == Split()  # may still open harmony
    assert splitter.feed("nel|>analysis<|mess") == Split()  # a header: its channel is not sure yet
    assert splitter.feed("age|>Let me") == Split(reasoning="Let me")
    assert splitter.feed(" see<|e") == Split(reasoning=" see")  # "<|e" may be <|end|>
    assert splitter.feed("nd|><|start|>assistant<|channel|>final<|message|>4") == Split(content="4")
    assert splitter.feed(" <x") == Split(content=" <x")  # cannot be a marker: out at once
    assert splitter.finish() == Split()
    plain = ReasoningSplitter(GPT_OSS)
    assert plain.feed("Hello") == Split(content="Hello")  # cannot open harmony: content at once
    assert plain.feed("<|end|>") == Split(content="<|end|>")


def test_the_markers_reach_the_parser_only_with_special_tokens_kept() -> None:
    """Why gpt_oss asks for `skip_special_tokens: false`: the workers' detokenizer, on a byte-level
    tokenizer whose harmony markers are special tokens (as gpt-oss's are)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from pipeline.output.detokenizer import IncrementalDetokenizer

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "analysis": 1, "final": 2, "Hi": 3, "assistant": 4,
                                            "Ġthere": 5}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(marker, special=True) for marker in
                                  ("<|channel|>", "<|message|>", "<|end|>", "<|start|>")])
    answer = f"<|channel|>analysis<|message|>Hi there{NEXT}<|channel|>final<|message|>Hi"

    class Decoder:
        def decode(self, token_ids: list[int], skip_special_tokens: bool = True, **_options: bool) -> str:
            return tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def detokenized(skip_special_tokens: bool) -> str:
        detokenizer = IncrementalDetokenizer(Decoder(), [], skip_special_tokens=skip_special_tokens,
                                             spaces_between_special_tokens=False)
        return "".join(detokenizer.add([token]) for token in tokenizer.encode(answer).ids) + detokenizer.finish()

    assert split_whole(GPT_OSS, detokenized(False)) == ("Hi there", "Hi")
    assert split_whole(GPT_OSS, detokenized(True)) == (None, "analysisHi thereassistantfinalHi")  # markers gone
