"""A page of a list as OpenAI's cursor pages give it (the Batch API's files and batches, a stored response's
input items): `limit` items past the one `after` names.

    {"object": "list", "data": [...], "first_id", "last_id", "has_more"}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from actors.http.errors import invalid


def cursor_page(ordered: list[dict[str, Any]], after: str | None, limit: int,
                not_found: Callable[[str], str]) -> dict[str, Any]:
    """`ordered` in the page's order; an `after` no item's id is is a 400 with the message `not_found(after)`."""
    start = _after(ordered, after, not_found)
    chosen = ordered[start:start + limit]
    return {"object": "list", "data": chosen, "first_id": chosen[0]["id"] if chosen else None,
            "last_id": chosen[-1]["id"] if chosen else None, "has_more": start + limit < len(ordered)}


def _after(items: list[dict[str, Any]], after: str | None, not_found: Callable[[str], str]) -> int:
    """Where the page starts: past the item `after` names."""
    if after is None:
        return 0
    for index, item in enumerate(items):
        if item["id"] == after:
            return index + 1
    raise invalid(not_found(after), "after")
