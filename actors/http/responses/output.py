"""Steps (steps.py) -> a Response's output items and the stream events that build them, in one machine:
the whole response takes its items, the stream sends its events (events.py), so the two agree.

    message        output_item.added, content_part.added, output_text.delta..., output_text.done,
                   content_part.done, output_item.done
    reasoning      the same, with reasoning_text parts and response.reasoning_text.delta / .done
    function_call  output_item.added, function_call_arguments.delta..., function_call_arguments.done,
                   output_item.done

An item stays open while its pieces come; a new item closes it as completed, and the item open when the
answer ends takes the answer's status (incomplete when max_output_tokens cut it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors.http.responses.input_items import new_id
from actors.http.responses.steps import ArgumentsPiece, CallEnd, CallStart, ReasoningPiece, Step, TextPiece

Event = dict[str, Any]
_PART_TYPE = {"message": "output_text", "reasoning": "reasoning_text"}
_TEXT_EVENT = {"message": "response.output_text", "reasoning": "response.reasoning_text"}


@dataclass(slots=True)
class _Item:
    kind: str  # message, reasoning, function_call
    id: str
    text: str = ""  # a function call's arguments
    name: str = ""
    call_id: str = ""
    status: str = "in_progress"
    index: int = 0  # its output_index

    def body(self, whole: bool = True) -> dict[str, Any]:
        """The item as OpenAI shows it: when opened (`whole` false: no content part yet) or closed."""
        if self.kind == "function_call":
            return {"id": self.id, "type": "function_call", "call_id": self.call_id, "name": self.name,
                    "arguments": self.text, "status": self.status}
        content = [self.part()] if whole else []
        if self.kind == "reasoning":
            return {"id": self.id, "type": "reasoning", "summary": [], "content": content, "status": self.status}
        return {"id": self.id, "type": "message", "role": "assistant", "status": self.status, "content": content}

    def part(self, text: str | None = None) -> dict[str, Any]:
        part = {"type": _PART_TYPE[self.kind], "text": self.text if text is None else text}
        return {**part, "annotations": []} if self.kind == "message" else part


class OutputBuilder:
    def __init__(self) -> None:
        self._items: list[_Item] = []
        self._open: _Item | None = None

    @property
    def output(self) -> list[dict[str, Any]]:
        return [item.body() for item in self._items]

    def apply(self, steps: list[Step]) -> list[Event]:
        events: list[Event] = []
        for step in steps:
            events += self._step(step)
        return events

    def close(self, status: str = "completed") -> list[Event]:
        """Closes the open item (none: nothing) with `status`."""
        item, self._open = self._open, None
        if item is None:
            return []
        item.status = status
        where = self._where(item)
        done = {"type": "response.output_item.done", "output_index": where["output_index"], "item": item.body()}
        if item.kind == "function_call":
            return [{"type": "response.function_call_arguments.done", **where, "name": item.name,
                     "arguments": item.text}, done]
        text_done = {"type": f"{_TEXT_EVENT[item.kind]}.done", **where, "content_index": 0, "text": item.text}
        if item.kind == "message":
            text_done["logprobs"] = []
        return [text_done, {"type": "response.content_part.done", **where, "content_index": 0, "part": item.part()},
                done]

    def _step(self, step: Step) -> list[Event]:
        if isinstance(step, ReasoningPiece | TextPiece):
            kind = "reasoning" if isinstance(step, ReasoningPiece) else "message"
            opened = [] if self._open is not None and self._open.kind == kind else self._start_text(kind)
            return opened + self._text(step.text)
        if isinstance(step, CallStart):
            return self._start(_Item("function_call", new_id("fc"), name=step.name, call_id=step.call_id))
        if isinstance(step, ArgumentsPiece):
            assert self._open is not None and self._open.kind == "function_call"
            self._open.text += step.text
            return [{"type": "response.function_call_arguments.delta", **self._where(self._open), "delta": step.text}]
        assert isinstance(step, CallEnd)
        return self.close()

    def _start_text(self, kind: str) -> list[Event]:
        item = _Item(kind, new_id("msg" if kind == "message" else "rs"))
        added = {"type": "response.content_part.added", **self._where(item), "content_index": 0, "part": item.part("")}
        return [*self._start(item), added]

    def _start(self, item: _Item) -> list[Event]:
        closed = self.close()
        item.index = len(self._items)
        self._items.append(item)
        self._open = item
        return [*closed, {"type": "response.output_item.added", "output_index": item.index,
                          "item": item.body(whole=False)}]

    def _text(self, text: str) -> list[Event]:
        item = self._open
        assert item is not None
        item.text += text
        delta = {"type": f"{_TEXT_EVENT[item.kind]}.delta", **self._where(item), "content_index": 0, "delta": text}
        return [{**delta, "logprobs": []} if item.kind == "message" else delta]

    def _where(self, item: _Item) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.index}
