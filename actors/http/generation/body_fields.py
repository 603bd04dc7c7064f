"""Body fields every protocol reads alike: which model a request names, and a boolean switch."""

from __future__ import annotations

from typing import Any

from actors.http.errors import ApiError, invalid


def served_adapter(model: Any, model_names: tuple[str, ...], adapters: list[str]) -> str | None:
    """The LoRA adapter `model` names (None: the base model, by any of its names); 404 for a model not served."""
    if model is None or model in model_names:
        return None
    if model in adapters:
        return str(model)
    served = ", ".join(repr(name) for name in [*model_names, *adapters])
    raise ApiError(404, f"the model {model!r} does not exist; this server serves {served}",
                   param="model", code="model_not_found")


def bool_field(body: dict[str, Any], name: str, default: bool = False) -> bool:
    """`body[name]` as true or false (absent or null: `default`); a 400 naming it otherwise."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"{name} must be true or false, got {value!r}", name)
    return value


def body_adapter(body: Any, model_names: tuple[str, ...], adapters: list[str]) -> str | None:
    """`served_adapter` of the body's `model`, after checking the body is a JSON object (a 400 otherwise)."""
    if not isinstance(body, dict):
        raise invalid(f"the body must be a JSON object, got {type(body).__name__}")
    return served_adapter(body.get("model"), model_names, adapters)

