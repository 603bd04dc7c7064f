"""An answer's text -> the steps that build a Response's output items, piece by piece as it comes: the
same steps build the whole response and the stream (output.py), so the streamed response is the
non-streamed one.

Under --reasoning-parser the text first splits into reasoning (`ReasoningPiece`) and content. The
content, with no tool plan, is `TextPiece`s as they come; with one (auto, required, a named function)
it goes through the plan's stream (actors/http/tool_parsers/): text as it comes, a call opened
(`CallStart`) as soon as its head is read, its arguments piece by piece (`ArgumentsPiece`) as they are
generated, as OpenAI streams function_call_arguments deltas, and `CallEnd` once they are whole. A
`required` answer cut before its first call is text.

The item open when the answer ends (a call cut short, say) is closed by output.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from actors.http.reasoning import ReasoningFormat, ReasoningSplitter, Split
from actors.http.tool_parsers.base import new_call_id
from actors.http.tool_parsers.events import CallArguments, CallOpened, ContentText, ToolEvent
from actors.http.tool_parsers.plan import ToolPlan


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
        self.splitter = ReasoningSplitter(reasoning) if reasoning is not None else None
        self.stream = plan.stream() if plan is not None else None

    @property
    def num_calls(self) -> int:
        return self.stream.num_calls if self.stream is not None else 0

    def feed(self, piece: str) -> list[Step]:
        """The steps `piece`, the answer's next text, makes."""
        return self._split(self.splitter.feed(piece) if self.splitter is not None else Split(content=piece))

    def finish(self) -> list[Step]:
        """The last steps, once the answer has ended."""
        steps = self._split(self.splitter.finish()) if self.splitter is not None else []
        return steps + _steps(self.stream.finish()) if self.stream is not None else steps

    def _split(self, split: Split) -> list[Step]:
        steps: list[Step] = [ReasoningPiece(split.reasoning)] if split.reasoning else []
        return steps + self._content(split.content) if split.content else steps

    def _content(self, piece: str) -> list[Step]:
        if self.stream is None:
            return [TextPiece(piece)]
        return _steps(self.stream.feed(piece))


def _steps(events: list[ToolEvent]) -> list[Step]:
    steps: list[Step] = []
    for event in events:
        if isinstance(event, ContentText):
            steps.append(TextPiece(event.text))
        elif isinstance(event, CallOpened):
            steps.append(CallStart(event.name, event.id))
        elif isinstance(event, CallArguments):
            steps.append(ArgumentsPiece(event.text))
        else:
            steps.append(CallEnd())
    return steps
