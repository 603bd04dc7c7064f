"""The reasoning split as a specification: each parser's answer for the shapes a model writes (both
markers, only the end marker, no end marker, no reasoning at all), and the same split however the
text is cut into pieces, markers cut at every position included; only a possible marker is held."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.http.reasoning import FORMATS, ReasoningSplitter, Split, format_for_request, split_whole

# (text, deepseek_r1 and qwen3's split, think's split)
CASES = [
    ("<think>I add.</think>4", ("I add.", "4"), ("I add.", "4")),
    ("\n<think>\nI add.\n</think>\n\n4", ("\nI add.\n", "\n\n4"), ("\nI add.\n", "\n\n4")),
    ("I add.</think>4", ("I add.", "4"), (None, "I add.</think>4")),  # the prompt opened <think>
    ("<think>cut short", ("cut short", None), ("cut short", None)),  # no end marker: all reasoning
    ("cut short", ("cut short", None), (None, "cut short")),
    ("</think>4", (None, "4"), (None, "</think>4")),
    ("<think></think>", (None, None), (None, None)),
    ("<think>a</think>b</think>c", ("a", "b</think>c"), ("a", "b</think>c")),  # the first end marker ends it
    ("<thinking>x</think>y", ("<thinking>x", "y"), (None, "<thinking>x</think>y")),
    ("x <think>y</think>z", ("x <think>y", "z"), (None, "x <think>y</think>z")),  # <think> opens only at the start
    ("", (None, None), (None, None)),
]
TEXTS = [text for text, _, _ in CASES] + ["<", "<think", "</", "</think", "  ", "<think>a</thi", "a<"]


@pytest.mark.parametrize(("text", "prompt_opened", "marker_opened"), CASES)
def test_each_parser_splits_the_whole_answer(text: str, prompt_opened: tuple, marker_opened: tuple) -> None:
    assert split_whole(FORMATS["deepseek_r1"], text) == prompt_opened
    assert split_whole(FORMATS["qwen3"], text) == prompt_opened
    assert split_whole(FORMATS["think"], text) == marker_opened


def test_qwen3_with_thinking_off_is_all_content() -> None:
    off = format_for_request("qwen3", {"enable_thinking": False}, constrained=False)
    assert split_whole(off, "<think>a</think>b") == (None, "<think>a</think>b")
    assert split_whole(off, "plain") == (None, "plain")
    assert format_for_request("qwen3", {"enable_thinking": True}, False) == FORMATS["qwen3"]
    assert format_for_request("qwen3", {"enable_thinking": 0}, False) == FORMATS["qwen3"]  # only `false` is off
    assert format_for_request("deepseek_r1", {"enable_thinking": False}, False) == FORMATS["deepseek_r1"]
    assert format_for_request(None, {}, False) is None


def test_a_constrained_answer_has_reasoning_only_behind_the_start_marker() -> None:
    constrained = format_for_request("deepseek_r1", None, constrained=True)
    assert split_whole(constrained, '{"a": 1}') == (None, '{"a": 1}')  # a JSON answer is the content
    assert split_whole(constrained, '<think>so</think>{"a": 1}') == ("so", '{"a": 1}')


def streamed(name: str, text: str, cuts: list[int]) -> tuple[list[Split], Split]:
    splitter = ReasoningSplitter(FORMATS[name])
    pieces = [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    outs = [splitter.feed(piece) for piece in pieces]
    outs.append(splitter.finish())
    return outs, Split("".join(out.reasoning for out in outs), "".join(out.content for out in outs))


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("text", TEXTS)
def test_a_marker_cut_at_any_position_splits_the_same(name: str, text: str) -> None:
    whole = split_whole(FORMATS[name], text)
    for cut in range(1, len(text)):
        _, joined = streamed(name, text, [cut])
        assert (joined.reasoning or None, joined.content or None) == whole
    _, one_by_one = streamed(name, text, list(range(1, len(text))))
    assert (one_by_one.reasoning or None, one_by_one.content or None) == whole


_PIECES = st.sampled_from(["<think>", "</think>", "<", "/", "think", ">", "a", " ", "\n", "</th", "ink>", "<thi"])


@pytest.mark.parametrize("name", sorted(FORMATS))
@settings(max_examples=150, deadline=None)
@given(parts=st.lists(_PIECES, max_size=12), data=st.data())
def test_any_text_cut_anywhere_streams_the_whole_split(name: str, parts: list[str], data: st.DataObject) -> None:
    text = "".join(parts)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(len(text) - 1, 1)), max_size=8))))
    _, joined = streamed(name, text, [cut for cut in cuts if cut < len(text)])
    assert (joined.reasoning or None, joined.content or None) == split_whole(FORMATS[name], text)


def test_only_what_may_be_a_marker_is_held() -> None:
    splitter = ReasoningSplitter(FORMATS["qwen3"])
    assert splitter.feed(" <thi") == Split()  # may still open with <think>
    assert splitter.feed("nk>Let me") == Split(reasoning="Let me")
    assert splitter.feed(" see</th") == Split(reasoning=" see")  # "</th" may be the end marker
    assert splitter.feed("ink>\n\n4") == Split(content="\n\n4")
    assert splitter.feed("<think>") == Split(content="<think>")  # after the reasoning, all is content
    assert splitter.finish() == Split()
    think = ReasoningSplitter(FORMATS["think"])
    assert think.feed("Hello") == Split(content="Hello")  # cannot be <think>: content at once
