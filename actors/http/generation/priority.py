"""vLLM's `priority` request extra: an integer, lower is more urgent, default 0 (docs/deployment.md#priorities).

Read by the HTTP routes and by batch lines alike; it travels as WireRequest.priority."""

from __future__ import annotations

from typing import Any

from queue_adapters.codec import PRIORITY_MAX, PRIORITY_MIN


class PriorityError(ValueError):
    field = "priority"


def pop_priority(body: dict[str, Any]) -> int:
    """Take `priority` off the body (null means 0); PriorityError naming the rule otherwise."""
    value = body.pop("priority", None)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise PriorityError(f"priority must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX} (lower is more "
                            f"urgent), got {value!r}")
    return value
