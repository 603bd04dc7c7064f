"""An answer's text -> Anthropic content blocks, piece by piece as it comes: the same steps build the
whole message (message.py: all the text at once) and the stream (events.py), so the streamed message
is the non-streamed one.

The steps: `ThinkingPiece` (add to the thinking block, or open it), `TextPiece` (add to the open text
block, or open one), `ToolStart` (open a tool_use block) and `InputPiece` (add to the open tool_use
block's input JSON). With --reasoning-parser (`ReasonedBlocks`), the answer's reasoning, split off by
actors/http/reasoning/, is the first block, a thinking one, and its content makes the rest as below
(tool calls are read from the content only). By the request's tool plan:

- none: the text as it comes;
- auto: text that cannot become a call goes out at once (the parser's `sendable`); the rest waits for
  the end, where the parser reads the calls out of the whole text (openai/tool_parsers/plan.py);
- tool (a named tool): the answer is its input object: the first piece opens the block, each piece
  adds to its input, as Anthropic streams `input_json_delta`s;
- any: each call of the constrained list goes out whole once its item is complete; an answer cut
  before its first call is text.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pydantic_core

from actors.http.reasoning import ReasoningFormat, ReasoningSplitter, Split
from actors.http.tool_parsers.plan import ToolPlan
from actors.http.tool_parsers.tool_choice import complete_items, required_call


@dataclass(slots=True)
class ThinkingPiece:
    thinking: str


@dataclass(slots=True)
class TextPiece:
    text: str


@dataclass(slots=True)
class ToolStart:
    name: str
    id: str = field(default_factory=lambda: f"toolu_{uuid.uuid4().hex[:24]}")


@dataclass(slots=True)
class InputPiece:
    partial_json: str


BlockStep = ThinkingPiece | TextPiece | ToolStart | InputPiece


@dataclass(slots=True)
class AnswerBlocks:
    plan: ToolPlan | None
    text: str = ""  # the answer so far
    sent: int = 0  # auto: characters of it sent as text; any: where the next list item begins
    num_calls: int = 0

    def feed(self, piece: str) -> list[BlockStep]:
        """The steps `piece`, the answer's next text, makes."""
        self.text += piece
        mode = self.plan.choice.mode if self.plan is not None else "none"
        if mode == "none":
            return [TextPiece(piece)] if piece else []
        if mode == "auto":
            return self._sendable()
        if mode == "named":
            return self._named(piece)
        return self._complete_calls()

    def finish(self) -> list[BlockStep]:
        """The last steps, once the answer has ended."""
        if self.plan is None:
            return []
        if self.plan.choice.mode == "auto":
            return self._parsed()
        if self.plan.choice.mode == "named":
            return self._named("") if self.num_calls == 0 else []
        return [TextPiece(self.text)] if self.num_calls == 0 and self.text else []

    def _sendable(self) -> list[BlockStep]:
        assert self.plan is not None
        upto = max(self.plan.sendable(self.text), self.sent)
        piece, self.sent = self.text[self.sent:upto], upto
        return [TextPiece(piece)] if piece else []

    def _parsed(self) -> list[BlockStep]:
        assert self.plan is not None
        parsed = self.plan.calls(self.text)
        rest = (parsed.content or "")[self.sent:]
        steps: list[BlockStep] = [TextPiece(rest)] if rest else []
        for call in parsed.calls:
            steps += [ToolStart(call.name), InputPiece(call.arguments)]
        self.num_calls = len(parsed.calls)
        return steps

    def _named(self, piece: str) -> list[BlockStep]:
        steps: list[BlockStep] = []
        if self.num_calls == 0:
            assert self.plan is not None and self.plan.choice.function is not None
            steps.append(ToolStart(self.plan.choice.function))
            self.num_calls = 1
        return [*steps, InputPiece(piece)] if piece else steps

    def _complete_calls(self) -> list[BlockStep]:
        assert self.plan is not None
        try:
            items, self.sent = complete_items(self.text, self.sent)
            calls = [required_call(item) for item in items]
        except (RecursionError, KeyError, TypeError):  # not the constraint's shape: left as text
            return []
        steps: list[BlockStep] = []
        for call in calls:
            if self.plan.parallel or self.num_calls == 0:
                steps += [ToolStart(call.name), InputPiece(call.arguments)]
                self.num_calls += 1
        return steps


class ReasonedBlocks:
    """The steps of an answer that may open with reasoning (`reasoning` None: the server has no reasoning
    parser, and the answer is all content)."""

    def __init__(self, plan: ToolPlan | None, reasoning: ReasoningFormat | None) -> None:
        self.content = AnswerBlocks(plan)
        self.splitter = ReasoningSplitter(reasoning) if reasoning is not None else None

    @property
    def num_calls(self) -> int:
        return self.content.num_calls

    def feed(self, piece: str) -> list[BlockStep]:
        if self.splitter is None:
            return self.content.feed(piece)
        return self._steps(self.splitter.feed(piece))

    def finish(self) -> list[BlockStep]:
        steps = self._steps(self.splitter.finish()) if self.splitter is not None else []
        return [*steps, *self.content.finish()]

    def _steps(self, split: Split) -> list[BlockStep]:
        steps: list[BlockStep] = [ThinkingPiece(split.reasoning)] if split.reasoning else []
        # Only text that is surely content: a tool plan must not see a piece still held as maybe reasoning.
        return [*steps, *self.content.feed(split.content)] if split.content else steps


def content_blocks(steps: list[BlockStep]) -> list[dict[str, Any]]:
    """A whole message's content from its steps."""
    blocks: list[dict[str, Any]] = []
    inputs: dict[int, str] = {}  # tool_use block -> its input JSON so far
    for step in steps:
        if isinstance(step, ThinkingPiece):
            if not blocks or blocks[-1]["type"] != "thinking":
                blocks.append({"type": "thinking", "thinking": "", "signature": ""})
            blocks[-1]["thinking"] += step.thinking
        elif isinstance(step, TextPiece):
            if not blocks or blocks[-1]["type"] != "text":
                blocks.append({"type": "text", "text": ""})
            blocks[-1]["text"] += step.text
        elif isinstance(step, ToolStart):
            inputs[len(blocks)] = ""
            blocks.append({"type": "tool_use", "id": step.id, "name": step.name, "input": {}})
        else:
            inputs[len(blocks) - 1] += step.partial_json
    for index, text in inputs.items():
        blocks[index]["input"] = tool_input(text)
    return blocks


def tool_input(text: str) -> dict[str, Any]:
    """A tool_use block's input from its JSON text: read as the Anthropic SDK reads a streamed input
    (partial JSON allowed), so an input cut by max_tokens is the same object streamed or not."""
    try:
        value = pydantic_core.from_json(text, allow_partial=True) if text.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
