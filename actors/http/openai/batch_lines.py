"""What `aqueduct batch` takes of the OpenAI protocol, in one place: a batch line's body parsed by the
parsers the HTTP routes use (completion_request.py, chat_request.py), and its answer written in the
shape the routes answer in (render.py, prompt_results.py), so a field and an answer mean the same in
a batch file and over HTTP. Free of the web stack: the CLI imports it without loading Starlette.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors.http.generation.priority import pop_priority
from actors.http.openai.chat_request import parse_chat_request
from actors.http.openai.completion_request import parse_completion_body, prompt_field
from actors.http.openai.prompt_results import merge_prompt_results
from actors.http.openai.render import completion_body
from actors.http.tool_parsers.plan import ToolPlan
from queue_adapters.codec import WireRequest

COMPLETIONS_URL = "/v1/completions"
CHAT_URL = "/v1/chat/completions"
URLS = (COMPLETIONS_URL, CHAT_URL)


@dataclass(slots=True)
class LineBody:
    """A line's body, checked: what its wire request carries and what its answer needs."""

    chat: bool  # a /v1/chat/completions line: answered with a chat.completion body
    params: dict[str, Any]  # the sampling fields as wire params, validated
    prompt_fields: dict[str, Any]  # the wire request's prompt (or token ids), or its messages, images and tools
    priority: int = 0  # the line's `priority`; `aqueduct batch` runs lines in its order
    echo: bool = False  # a completions line's `echo`: its prompt comes first in each choice
    tool_plan: ToolPlan | None = None  # a chat line with tools: what its answers' text becomes


def parse_line_body(url: str, body: Any, tool_parser: str | None) -> LineBody:
    """The body of a line for `url` (one of URLS); ValueError naming the field at fault."""
    if not isinstance(body, dict):
        raise ValueError(f"body must be a JSON object, got {type(body).__name__}")
    body = dict(body)
    priority = pop_priority(body)
    if url == CHAT_URL:
        chat = parse_chat_request(body, tool_parser)  # validates the sampling and tool fields
        fields = {"messages": chat.messages, "images": chat.images or None, "tools": chat.tools,
                  "chat_template_kwargs": chat.template_kwargs}
        return LineBody(True, chat.params, fields, priority, tool_plan=chat.tool_plan)
    completion = parse_completion_body(body)  # validates the sampling fields
    if len(completion.prompts) != 1:
        raise ValueError(f"prompt must be one prompt per batch line, got a list of {len(completion.prompts)}")
    return LineBody(False, completion.params, prompt_field(completion.prompts[0]), priority, echo=completion.echo)


def answer_body(line: LineBody, request: WireRequest, custom_id: str, result: dict[str, Any], model_name: str,
                tokenizer: Any | None) -> dict[str, Any]:
    """The `text_completion` or `chat.completion` object of a line's finished, error-free result."""
    if not line.chat:  # choices carry their prompt's logprobs, and echo's prompt
        result = _with_prompt(line, request, result, tokenizer)
    response_id = f"chatcmpl-{custom_id}" if line.chat else f"cmpl-{custom_id}"
    return completion_body(response_id, result, model_name, tokenizer, line.chat, line.tool_plan)


def _with_prompt(line: LineBody, request: WireRequest, result: dict[str, Any], tokenizer: Any | None) -> dict[str, Any]:
    prompt = request.prompt if request.prompt is not None else request.prompt_token_ids
    n = int(request.params.get("n", 1) or 1)
    return merge_prompt_results([result], n, [prompt] if prompt is not None else None, line.echo, tokenizer)
