"""vLLM's runtime LoRA routes: POST /v1/load_lora_adapter `{lora_name, lora_path, load_inplace?}` and
POST /v1/unload_lora_adapter `{lora_name}`, mounted only when runtime updating is on (as vLLM, whose
switch is VLLM_ALLOW_RUNTIME_LORA_UPDATING), behind the API key.

A body becomes a `load_lora` / `unload_lora` control entry, decoded as a worker decodes one, and the
backend applies it under --lora-root: embedded, as a worker's control actor does; in front of Redis,
every live worker does (each under its own root too) and answers. Answers as vLLM's: 200 with a line
of text; 400 for a bad body, a name already loaded or an adapter some worker could not load (each
worker's reason named); 404 to unload a name no worker has; 503 with no live worker; 504 naming the
workers that did not answer within --worker-timeout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from actors.http.backends import Backend
from actors.http.errors import ApiError, invalid
from actors.http.limits import read_json_object
from actors.http.options import GatewayOptions
from queue_adapters.client import ControlAnswers
from queue_adapters.codec import CodecError, WireControl, WireControlResult, decode_control, encode

log = structlog.get_logger(__name__)


def add_lora_routes(app: FastAPI, backend: Backend, options: GatewayOptions) -> None:
    if not options.runtime_lora_updating:
        return  # not mounted: 404, as vLLM without its switch
    root = Path(options.lora_root).resolve() if options.lora_root is not None else None
    log.warning("runtime LoRA updating is on: /v1/load_lora_adapter loads adapters from this host's files",
                lora_root=str(root) if root is not None else "none: any directory this server can read")

    async def load(request: Request) -> Response:
        body = await read_json_object(request, options.api_key, options.max_request_bytes)
        if not body.get("lora_name") or not body.get("lora_path"):
            raise invalid("Both 'lora_name' and 'lora_path' must be provided.")
        control = _control({"load_lora": {"name": _text(body, "lora_name"), "path": _text(body, "lora_path")}})
        name, path = control.load_lora.name, control.load_lora.path
        if name in (backend.model_name, *options.served_model_names):
            raise invalid(f"'{name}' is the base model's name", "lora_name")
        if name in backend.adapter_names() and body.get("load_inplace") is not True:
            raise invalid(f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in "
                          "place, set 'load_inplace' to True.", "lora_name")
        answers = await backend.change_lora(control, root, options.worker_timeout_s)
        _raise_for_failures(answers, name, options.worker_timeout_s, unloading=False)
        log.info("lora adapter loaded over HTTP", adapter=name, path=path)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(request: Request) -> Response:
        body = await read_json_object(request, options.api_key, options.max_request_bytes)
        if not body.get("lora_name"):
            raise invalid("'lora_name' needs to be provided to unload a LoRA adapter.")
        name = _control({"unload_lora": _text(body, "lora_name")}).unload_lora or ""
        answers = await backend.change_lora(WireControl(unload_lora=name), root, options.worker_timeout_s)
        _raise_for_failures(answers, name, options.worker_timeout_s, unloading=True)
        log.info("lora adapter unloaded over HTTP", adapter=name)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    app.add_route("/v1/load_lora_adapter", load, methods=["POST"])
    app.add_route("/v1/unload_lora_adapter", unload, methods=["POST"])


def _text(body: dict[str, Any], field: str) -> str:
    value = body[field]
    if not isinstance(value, str):
        raise invalid(f"{field} must be a string, got {type(value).__name__}", field)
    return value


_BODY_FIELD_OF = {"load_lora.name": "lora_name", "load_lora.path": "lora_path", "unload_lora": "lora_name"}


def _control(entry: dict[str, Any]) -> WireControl:
    """The entry as a worker decodes it: the wire's rules (a name's length) are the body's 400."""
    try:
        return decode_control(encode(entry))
    except CodecError as error:
        message = str(error)
        wire_field = next((key for key in _BODY_FIELD_OF if message.startswith(key + " ")), None)
        if wire_field is None:
            raise invalid(message) from None
        field = _BODY_FIELD_OF[wire_field]
        raise invalid(field + message[len(wire_field):], field) from None


def _raise_for_failures(outcome: ControlAnswers, name: str, timeout_s: float, *, unloading: bool) -> None:
    """The answers as one status: a failed load (any worker's refusal), an unload no worker could do,
    then silence."""
    if not outcome.answers and not outcome.missing:
        raise ApiError(503, "no worker is alive to apply it", code="no_workers")
    failed = [answer for answer in outcome.answers if not answer.ok]
    reasons = "; ".join(_reason(answer) for answer in failed)
    if failed and not unloading:
        undone = " (unloaded again where it had loaded)" if len(failed) < len(outcome.answers) else ""
        raise ApiError(400, reasons + undone, param="lora_path", code="lora_load_failed")
    if unloading and len(failed) == len(outcome.answers) and not outcome.missing:
        raise ApiError(404, f"The lora adapter '{name}' cannot be found: {reasons}", param="lora_name",
                       code="lora_not_found")
    if outcome.missing:
        raise ApiError(504, f"no answer within {timeout_s:g} s (--worker-timeout) from the workers "
                            f"{', '.join(outcome.missing)}: adapter '{name}' may be on some workers only",
                       code="lora_timeout")


def _reason(answer: WireControlResult) -> str:
    return f"worker {answer.worker}: {answer.error}" if answer.worker else str(answer.error)
