"""Typed access to a GGUF file's key-value metadata."""

from __future__ import annotations

from typing import Any

from gguf import GGUFReader


class GgufMetadata:
    """A reader's fields, decoded on demand: the token and merge lists are large and mostly unneeded."""

    def __init__(self, reader: GGUFReader) -> None:
        self._fields = reader.fields
        self.architecture: str = self.require("general.architecture")

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str) -> Any:
        if key not in self._fields:
            raise ValueError(f"GGUF metadata has no {key!r}, which this converter needs")
        return self._fields[key].contents()

    def arch(self, key: str, default: Any = None) -> Any:
        """`{architecture}.{key}`, e.g. arch('block_count') -> llama.block_count."""
        return self.get(f"{self.architecture}.{key}", default)

    def require_arch(self, key: str) -> Any:
        return self.require(f"{self.architecture}.{key}")

    def array_length(self, key: str) -> int | None:
        field = self._fields.get(key)
        return None if field is None else len(field.data)
