"""A resumed request's text is the text of an uninterrupted run, wherever the crash falls: inside
a possible stop string (its held-back start), or inside a character split over tokens."""

from __future__ import annotations

import pytest

from actors.worker.recovery.resume import resume_state
from actors.worker.replies import to_wire
from pipeline.output.output_processor import OutputProcessor
from pipeline.request.outputs import TokenEvent
from pipeline.request.sampling_params import SamplingParams

TEXT = "Grüß Gott 🍜 and then END of text 🍙 done"
PROMPT = [5, 6, 7]


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


def _run(outputs: OutputProcessor, token_ids: list[int], last_finishes: bool) -> list:
    """Feed tokens one per step, as the scheduler does; the last one ends the choice by length."""
    deltas = []
    for position, token_id in enumerate(token_ids):
        finish = "length" if last_finishes and position == len(token_ids) - 1 else None
        step_deltas, finishes = outputs.process([TokenEvent("r", 0, token_id, finish_reason=finish)])
        deltas += step_deltas
        if finishes:
            break
    return deltas


def _text(deltas: list) -> tuple[str, list[tuple[str, str | None]]]:
    """The choice's text, and its (finish_reason, stop_reason) as often as it was reported."""
    choices = [choice for delta in deltas for choice in delta.choices]
    return ("".join(choice.text for choice in choices),
            [(choice.finish_reason, choice.stop_reason) for choice in choices if choice.finish_reason])


@pytest.mark.parametrize("stop", [(), ("END",)], ids=["no-stop", "stop-string"])
def test_text_after_a_resume_at_every_token_equals_the_uninterrupted_text(tokenizer, stop):
    token_ids = tokenizer.encode(TEXT)
    params = SamplingParams(max_tokens=len(token_ids), stop=stop)
    whole = OutputProcessor(tokenizer)
    whole.add_request("r", PROMPT, params)
    expected = _text(_run(whole, token_ids, last_finishes=True))
    assert expected == ((TEXT, [("length", None)]) if not stop else ("Grüß Gott 🍜 and then ", [("stop", "END")]))
    for crash_at in range(1, len(token_ids)):
        first = OutputProcessor(tokenizer)
        first.add_request("r", PROMPT, params)
        sent = _run(first, token_ids[:crash_at], last_finishes=False)
        if sent and any(choice.finish_reason for choice in sent[-1].choices):
            continue  # finished before the crash: nothing to resume
        resumed = OutputProcessor(tokenizer)
        resumed.add_request("r", PROMPT, params, resume_state([to_wire(delta) for delta in sent], 1))
        rest = _run(resumed, token_ids[crash_at:], last_finishes=True)
        assert _text(sent + rest) == expected, crash_at
