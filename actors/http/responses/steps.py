"""An answer's text -> the steps that build a Response's output items, piece by piece as it comes: the
same steps build the whole response and the stream (output.py), so the streamed response is the
non-streamed one.

Under --reasoning-parser the text first splits into reasoning (`ReasoningPiece`) and content. The
content, by the request's tool plan:

- none: `TextPiece`s as they come;
- auto: text that cannot become a call goes out at once (the parser's `sendable`); the rest waits for
  the end, where the parser reads the calls out of the whole content;
- a named function: the answer is its arguments: the first piece opens the call (`CallStart`), each
  piece adds to them (`ArgumentsPiece`), as OpenAI streams function_call_arguments deltas;
- required: each call of the constrained list goes out whole once its item is complete; an answer
  cut before its first call is text.

A call that is whole ends with `CallEnd`; the item open when the answer ends is closed by output.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from actors.http.reasoning import ReasoningFormat, ReasoningSplitter, Split
from actors.http.tool_parsers.base import new_call_id
from actors.http.tool_parsers.plan import ToolPlan
from actors.http.tool_parsers.tool_choice import complete_items, required_call


@dataclass(slots=True)
class ReasoningPiece:
    text: str


@dataclass(slots=True)
class TextPiece:
    text: str


@dataclass(slots=True)
class CallStart:
    name: str
    call_id: str = field(default_factory=new_call_id)


@dataclass(slots=True)
class ArgumentsPiece:
    text: str


@dataclass(slots=True)
class CallEnd:
    pass


Step = ReasoningPiece | TextPiece | CallStart | ArgumentsPiece | CallEnd


class AnswerSteps:
    def __init__(self, plan: ToolPlan | None, reasoning: ReasoningFormat | None) -> None:
        self.plan = plan
        self.splitter = ReasoningSplitter(reasoning) if reasoning is not None else None
        self.mode = plan.choice.mode if plan is not None else "none"
        self.content = ""  # the content so far
        self.sent = 0  # auto: characters of it sent as text; required: where the next list item begins
        self.num_calls = 0

    def feed(self, piece: str) -> list[Step]:
        """The steps `piece`, the answer's next text, makes."""
        return self._split(self.splitter.feed(piece) if self.splitter is not None else Split(content=piece))

    def finish(self) -> list[Step]:
        """The last steps, once the answer has ended."""
        steps = self._split(self.splitter.finish()) if self.splitter is not None else []
        if self.mode == "auto":
            return steps + self._parsed()
        if self.mode == "named" and self.num_calls == 0:
            return steps + self._named("")
        if self.mode == "required" and self.num_calls == 0 and self.content:
            return [*steps, TextPiece(self.content)]
        return steps

    def _split(self, split: Split) -> list[Step]:
        steps: list[Step] = [ReasoningPiece(split.reasoning)] if split.reasoning else []
        return steps + self._content(split.content) if split.content else steps

    def _content(self, piece: str) -> list[Step]:
        self.content += piece
        if self.mode == "none":
            return [TextPiece(piece)]
        if self.mode == "auto":
            return self._sendable()
        if self.mode == "named":
            return self._named(piece)
        return self._complete_calls()

    def _sendable(self) -> list[Step]:
        assert self.plan is not None
        upto = max(self.plan.sendable(self.content), self.sent)
        piece, self.sent = self.content[self.sent:upto], upto
        return [TextPiece(piece)] if piece else []

    def _parsed(self) -> list[Step]:
        assert self.plan is not None
        parsed = self.plan.calls(self.content)
        rest = (parsed.content or "")[self.sent:]
        steps: list[Step] = [TextPiece(rest)] if rest else []
        for call in parsed.calls:
            steps += [CallStart(call.name, call.id), ArgumentsPiece(call.arguments), CallEnd()]
        self.num_calls = len(parsed.calls)
        return steps

    def _named(self, piece: str) -> list[Step]:
        steps: list[Step] = []
        if self.num_calls == 0:
            assert self.plan is not None and self.plan.choice.function is not None
            steps.append(CallStart(self.plan.choice.function))
            self.num_calls = 1
        return [*steps, ArgumentsPiece(piece)] if piece else steps

    def _complete_calls(self) -> list[Step]:
        assert self.plan is not None
        try:
            items, self.sent = complete_items(self.content, self.sent)
            calls = [required_call(item) for item in items]
        except (RecursionError, KeyError, TypeError):  # not the constraint's shape: left as text
            return []
        steps: list[Step] = []
        for call in calls:
            if self.plan.parallel or self.num_calls == 0:
                steps += [CallStart(call.name, call.id), ArgumentsPiece(call.arguments), CallEnd()]
                self.num_calls += 1
        return steps

