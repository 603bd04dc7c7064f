"""An answer's text -> Anthropic content blocks, piece by piece as it comes: the same steps build the
whole message (message.py: all the text at once) and the stream (events.py), so the streamed message
is the non-streamed one.

The steps: `ThinkingPiece` (add to the thinking block, or open it), `TextPiece` (add to the open text
block, or open one), `ToolStart` (open a tool_use block) and `InputPiece` (add to the open tool_use
block's input JSON). With --reasoning-parser (`ReasonedBlocks`), the answer's reasoning, split off by
actors/http/reasoning/, is the first block, a thinking one, and its content makes the rest (tool calls
are read from the content only). With a tool plan (auto, any, a named tool), the content goes through
the plan's stream (actors/http/tool_parsers/): text as it comes, a tool_use block as soon as a call's
head is read, its input as `input_json_delta`s as it is generated; an `any` answer cut before its
first call is text.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pydantic_core

from actors.http.reasoning import ReasoningFormat, ReasoningSplitter, Split
from actors.http.tool_parsers.events import CallArguments, CallOpened, ContentText, ToolEvent
from actors.http.tool_parsers.plan import ToolPlan


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


class AnswerBlocks:
    """The steps of an answer's content, by the request's tool plan (None: all text)."""

    def __init__(self, plan: ToolPlan | None) -> None:
        self.stream = plan.stream() if plan is not None else None

    @property
    def num_calls(self) -> int:
        return self.stream.num_calls if self.stream is not None else 0

    def feed(self, piece: str) -> list[BlockStep]:
        """The steps `piece`, the answer's next text, makes."""
        if self.stream is None:
            return [TextPiece(piece)] if piece else []
        return _steps(self.stream.feed(piece))

    def finish(self) -> list[BlockStep]:
        """The last steps, once the answer has ended."""
        return _steps(self.stream.finish()) if self.stream is not None else []


def _steps(events: list[ToolEvent]) -> list[BlockStep]:
    steps: list[BlockStep] = []
    for event in events:
        if isinstance(event, ContentText):
            steps.append(TextPiece(event.text))
        elif isinstance(event, CallOpened):
            steps.append(ToolStart(event.name))
        elif isinstance(event, CallArguments):
            steps.append(InputPiece(event.text))
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
