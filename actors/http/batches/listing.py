"""GET /v1/files and GET /v1/batches: a page of a list, as OpenAI's cursor pages: `limit`, `after` (the id the
previous page ended with), newest first (files also take `order=asc`).

    {"object": "list", "data": [...], "first_id", "last_id", "has_more"}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors.http.cursor_pages import cursor_page
from actors.http.errors import invalid


def page(items: list[dict[str, Any]], query: Mapping[str, str], default_limit: int, max_limit: int,
         known: tuple[str, ...] = ("limit", "after")) -> dict[str, Any]:
    """`items` newest first; a query parameter not `known` is a 400."""
    unknown = sorted(name for name in query if name not in known)
    if unknown:
        raise invalid(f"unknown query parameter(s) {', '.join(map(repr, unknown))[:200]} (known: {', '.join(known)})",
                      unknown[0][:100])
    limit = _limit(query.get("limit"), default_limit, max_limit)
    order = query.get("order", "desc")  # `known` only for files
    if order not in ("asc", "desc"):
        raise invalid(f"order must be asc or desc, got {order[:100]!r}", "order")
    ordered = items if order == "desc" else items[::-1]
    return cursor_page(ordered, query.get("after"), limit,
                       lambda after: f"after: no such id in the list, {after[:100]!r}")


def _limit(value: str | None, default_limit: int, max_limit: int) -> int:
    if value is None:
        return default_limit
    if not (value.isascii() and value.isdigit() and len(value) <= 9) or not 1 <= int(value) <= max_limit:
        raise invalid(f"limit must be an integer from 1 to {max_limit}, got {value[:100]!r}", "limit")
    return int(value)
