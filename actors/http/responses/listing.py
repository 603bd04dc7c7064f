"""GET /v1/responses/{id}/input_items: a stored response's input items, a page at a time, as OpenAI's
cursor pages: `limit` (1-100, 20 by default), `order` (`desc`, the default, or `asc`), `after` (an item id).

    {"object": "list", "data": [...], "first_id", "last_id", "has_more"}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors.http.cursor_pages import cursor_page
from actors.http.errors import invalid

_DEFAULT_LIMIT, _MAX_LIMIT = 20, 100


def input_items_page(items: list[dict[str, Any]], query: Mapping[str, str]) -> dict[str, Any]:
    limit = _limit(query.get("limit"))
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid(f"order must be asc or desc, got {order!r}", "order")
    ordered = items if order == "asc" else items[::-1]
    return cursor_page(ordered, query.get("after"), limit,
                       lambda after: f"after: the response has no input item {after!r}")


def _limit(value: str | None) -> int:
    if value is None:
        return _DEFAULT_LIMIT
    if not value.isdigit() or not 1 <= int(value) <= _MAX_LIMIT:
        raise invalid(f"limit must be an integer from 1 to {_MAX_LIMIT}, got {value!r}", "limit")
    return int(value)
