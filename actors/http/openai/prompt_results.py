"""The per-prompt results of one completions request as one result: OpenAI's choice order and summed usage.

A request with several prompts runs as one wire request per prompt (actors/http/openai/parse.py); its
choices are numbered `prompt_index * n + j`, as OpenAI numbers them. Each choice carries what it
needs of its prompt: the prompt's logprobs and token ids (when the worker scored the prompt) and,
for `echo`, the prompt's text.
"""

from __future__ import annotations

from typing import Any

from actors.http.openai.completion_request import Prompt


def merge_prompt_results(results: list[dict[str, Any]], n: int, prompts: list[Prompt] | None, echo: bool,
                         tokenizer: Any | None) -> dict[str, Any]:
    """One result (as queue_adapters.client.assemble makes) from each prompt's, in prompt order."""
    choices = []
    for prompt_index, result in enumerate(results):
        prompt = prompts[prompt_index] if prompts is not None else None
        choices.extend(prompt_choice(choice, prompt_index * n, result, prompt if echo else None, tokenizer)
                       for choice in result["choices"])
    errors = [result["error"] for result in results if result["error"] is not None]
    return {"id": results[0]["id"], "choices": choices, "usage": _summed_usage(results),
            "error": errors[0] if errors else None, "prompt_logprobs": None}


def prompt_choice(choice: dict[str, Any], first_index: int, result: dict[str, Any], echo_prompt: Prompt | None,
                  tokenizer: Any | None) -> dict[str, Any]:
    """`choice` renumbered after its prompt's first choice, with its prompt's logprobs and echo."""
    merged = {**choice, "index": first_index + choice["index"]}
    if result.get("prompt_logprobs") is not None:
        merged["prompt_logprobs"] = result["prompt_logprobs"]
        merged["prompt_token_ids"] = result.get("prompt_token_ids")
    if echo_prompt is not None:
        merged["echo_text"] = prompt_text(echo_prompt, tokenizer)
    return merged


def prompt_text(prompt: Prompt, tokenizer: Any | None) -> str:
    """A prompt as `echo` shows it: the client's text, or its token ids decoded."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.decode(prompt) if tokenizer is not None else ""


def _summed_usage(results: list[dict[str, Any]]) -> dict[str, int] | None:
    usages = [result["usage"] for result in results if result["usage"] is not None]
    if not usages:
        return None
    return {key: sum(usage[key] for usage in usages) for key in ("prompt_tokens", "completion_tokens", "cached_tokens")}
