"""Kobold's `genkey`: the client's name for a generation, which /api/extra/abort cancels by.

Genkeys are short and client-made (KoboldAI Lite's are "KCPP" and four digits), so two clients can
pick the same one: a genkey is looked up together with the Authorization header it came with, and
one client cannot abort another's generation. The latest generation under a genkey is the one an
abort reaches. Kept in this gateway's memory, bounded, oldest forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict

_KEPT = 65_536


class Genkeys:
    def __init__(self, capacity: int = _KEPT) -> None:
        self.capacity = capacity
        self._request_ids: OrderedDict[tuple[str, str], str] = OrderedDict()

    def bind(self, authorization: str | None, genkey: str, request_id: str) -> None:
        key = (authorization or "", genkey)
        self._request_ids[key] = request_id
        self._request_ids.move_to_end(key)
        while len(self._request_ids) > self.capacity:
            self._request_ids.popitem(last=False)

    def request_id(self, authorization: str | None, genkey: str) -> str | None:
        return self._request_ids.get((authorization or "", genkey))
