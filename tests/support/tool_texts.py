"""Tool answers' texts for the streaming tests of every protocol (chat chunks, Anthropic's blocks, the
Responses items): per parser a call, the pieces a drawn answer is made of (calls, markers and their
beginnings, braces, escapes, words), and the cuts a stream's reply entries make of a text.

`one_by_one` cuts a text at every character boundary at once: every token boundary of any tokenizer is
among them, so an answer that streams right fed this way streams right token by token."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import strategies as st

CALLS = {"hermes": '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>',
         "llama3_json": '<|python_tag|>{"name": "weather", "parameters": {"city": "Oslo"}}',
         "mistral": '[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Oslo"}}]',
         "openai": '<|channel|>commentary to=functions.weather <|constrain|>json<|message|>{"city": "Oslo"}'}
REQUIRED = '[{"name": "weather", "parameters": {"city": "Oslo"}}, {"name": "clock", "parameters": {"hours": 7}}]'
NAMED = '{"city": "Oslo", "days": [1, 2], "note": "a } and a \\" inside"}'

_EVERYWHERE = ["Sure. ", " ", "\n", "{", "}", '"', "\\", "x", "[", "]", ";", ",", '{"name": "clock", ',
               '"arguments": ', '"parameters": ', '{"hours": 7}', '"{\\"zone\\": \\"CET\\"}"', '"\\ud83d\\ude00"',
               '{"s": "}{<"}']
PIECES = {
    "hermes": [CALLS["hermes"], "<tool_call>", "</tool_call>", "<tool_", "</tool", '{"name": "f"}',
               "<tool_call>{not json</tool_call>"],
    "llama3_json": [CALLS["llama3_json"], "<|python_tag|>", "<|python", '{"name": "f", "parameters": {}}',
                    '{"answer": 42}', "and words"],
    "mistral": [CALLS["mistral"], "[TOOL_CALLS]", "[TOOL_", '[{"name": "f", "arguments": {}}]', "Done."],
    "openai": [CALLS["openai"], "<|call|>", "<|end|>", "<|start|>assistant", "<|chan", "<|channel|>",
               "<|channel|>commentary<|message|>", "<|channel|>commentary to=functions.clock<|message|>",
               "<|constrain|>json", "<|message|>", "<|"],
}
TEXTS = {parser: [call, "Sure thing. " + call, "No call here, only words.", "  \n", call[:len(call) // 2],
                  call[:5] + " and more", "<" + call, call + " and after"] for parser, call in CALLS.items()}
TEXTS["hermes"] += ['Checking. <tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call> then '
                    '<tool_call>\n{"name": "clock", "arguments": "{\\"zone\\": \\"CET\\"}"}\n</tool_call>',
                    "<tool_call>" + "[" * 5000]
TEXTS["llama3_json"] += [' ; {"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": [1]}}',
                         '{"answer": 42}', "[" * 5000]
TEXTS["mistral"] += ['[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Oslo"}}, '
                     '{"name": "clock", "arguments": {"zone": "CET"}}] Done.', "[TOOL_CALLS]" + "[" * 5000]
TEXTS["openai"] += [CALLS["openai"] + "<|call|>", "Hm.<|start|>assistant" + CALLS["openai"] + "<|call|><|start|>"
                    "assistant" + CALLS["openai"], '<|channel|>analysis to=python code<|message|>{"a": 1}']


def answer_texts(parser: str) -> st.SearchStrategy[str]:
    """Texts made of a parser's pieces and the ones every format meets."""
    return st.lists(st.sampled_from(PIECES[parser] + _EVERYWHERE), max_size=8).map("".join)


def cut_at(text: str, cuts: list[int]) -> list[str]:
    """`text` in pieces, cut at `cuts` (sorted, within the text)."""
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[start:end] for start, end in itertools.pairwise(bounds)]


def drawn_cuts(data: st.DataObject, text: str) -> list[str]:
    """`text` cut where hypothesis draws."""
    return cut_at(text, data.draw(st.lists(st.integers(0, len(text)), max_size=12)))


def one_by_one(text: str) -> list[str]:
    return list(text)


def add_call_deltas(calls: dict[int, list[str]], deltas: list[dict[str, Any]]) -> None:
    """One chat chunk's `delta.tool_calls` added to `calls` (index -> [name, arguments so far]) as a client
    adds them up, checking OpenAI's shapes: a call's first delta has its id, type and name and arguments "",
    later ones only add to its arguments, and no chunk names a call twice."""
    indices = [delta["index"] for delta in deltas]
    assert len(indices) == len(set(indices))  # the openai SDK's accumulator takes a first list as it is
    for delta in deltas:
        if "id" in delta:
            assert delta["index"] == len(calls) and delta["type"] == "function" and delta["id"]
            assert delta["function"]["arguments"] == ""
            calls[delta["index"]] = [delta["function"]["name"], ""]
        else:
            assert set(delta) == {"index", "function"} and set(delta["function"]) == {"arguments"}
            calls[delta["index"]][1] += delta["function"]["arguments"]
