"""Size limits checked on a request entry's msgpack headers, before it is decoded (docs/design.md §3).

A map's or list's header says how many items follow, a str's or bin's how many bytes, so an entry
over a limit is refused at that header, in microseconds: decoded whole first, a 290,000-entry
`logit_bias` held a worker for about a second before any check saw it. The fields a client fills
with many items (the top-level fields and `params`' lists and maps) have limits of their own, from
the deployment's request limits; anything deeper gets the generic ones, which msgpack's unpacker
enforces at every header it reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import msgpack

from pipeline.request.sampling_params import LIST_LIMITS
from pipeline.request.tools import MAX_ARGUMENTS_CHARS, MAX_TOOLS, MAX_TOOLS_CHARS

MAX_ID_BYTES = 128  # ids are ASCII (codec.ID_PATTERN)
MAX_KEY_BYTES = 4 * 512  # reply_to and lora: 512 characters of at most 4 UTF-8 bytes
MAX_TOP_LEVEL_KEYS = 16  # a request has 10 fields
MAX_PARAMS = 256  # sampling parameter names (unknown names are refused after decoding)
MAX_NESTED_ITEMS = 4096  # any list or map deeper than the fields below (a JSON schema, content parts)
MAX_EXT_BYTES = 1024  # extension values are refused after decoding; a big one is refused here
_UTF8_BYTES = 4  # a character is at most 4 bytes: a text within the byte limit may still be too long


class WireLimitError(ValueError):
    """An entry over a size limit; the message names the field and the limit."""


@dataclass(frozen=True, slots=True)
class FieldLimit:
    items: int | None = None  # list items or map entries
    size: int | None = None  # bytes of a str or bin
    source: str = ""  # where the limit comes from, for the error message


@dataclass(frozen=True, slots=True)
class WireLimits:
    """`fields`: by path (`prompt`, `params.logit_bias`); `max_*`: the generic limits for the rest."""

    fields: dict[str, FieldLimit] = field(default_factory=dict)
    max_str_bytes: int = 2**20
    max_bin_bytes: int = 2**20
    max_list_items: int = MAX_NESTED_ITEMS
    max_map_entries: int = MAX_NESTED_ITEMS

    @classmethod
    def of(cls, *, max_prompt_chars: int, max_image_bytes: int, max_stop_strings: int, max_logit_bias: int,
           max_token_bans: int) -> WireLimits:
        """From a deployment's limits: `max_prompt_chars` is max_model_len x --max-prompt-chars-per-token
        (also the most prompt_token_ids: truncate_prompt_tokens may cut a longer list to fit)."""
        ceilings = {name: most for name, most, _ in LIST_LIMITS}
        prompt_source = "max_model_len x --max-prompt-chars-per-token"
        fields = {
            "": FieldLimit(items=MAX_TOP_LEVEL_KEYS, source="a request has 10 fields"),
            "id": FieldLimit(size=MAX_ID_BYTES, source="ids are 1-128 characters"),
            "reply_to": FieldLimit(size=MAX_KEY_BYTES, source="512 characters"),
            "lora": FieldLimit(size=MAX_KEY_BYTES, source="512 characters"),
            "prompt": FieldLimit(size=_UTF8_BYTES * max_prompt_chars,
                                 source=f"{max_prompt_chars} characters: {prompt_source}"),
            "prompt_token_ids": FieldLimit(items=max_prompt_chars, source=prompt_source),
            "tools": FieldLimit(items=MAX_TOOLS, source="tools"),
            "params": FieldLimit(items=MAX_PARAMS, source="sampling parameters"),
            "params.stop": FieldLimit(items=max_stop_strings, source="--max-stop-strings"),
            "params.logit_bias": FieldLimit(items=max_logit_bias, source="--max-logit-bias"),
            "params.custom_token_bans": FieldLimit(items=max_token_bans, source="--max-token-bans"),
            "params.stop_token_ids": FieldLimit(items=ceilings["stop_token_ids"], source="stop_token_ids"),
            "params.dry_sequence_breakers": FieldLimit(items=ceilings["dry_sequence_breakers"],
                                                       source="dry_sequence_breakers"),
        }
        data_uri_chars = 4 * (max_image_bytes // 3 + 1) + 256  # an image_url part's base64 and its header
        longest_text = max(_UTF8_BYTES * max(max_prompt_chars, MAX_ARGUMENTS_CHARS, MAX_TOOLS_CHARS), data_uri_chars)
        return cls(fields, max_str_bytes=longest_text, max_bin_bytes=max_image_bytes,
                   max_list_items=max(max_prompt_chars, MAX_NESTED_ITEMS),
                   max_map_entries=max(max_logit_bias, MAX_NESTED_ITEMS))


def check_wire_limits(raw: bytes, limits: WireLimits) -> None:
    """Raises WireLimitError at the first header over a limit. An entry that is not a well-formed map
    passes: decoding it says what is wrong, and stops as early as this walk would."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(raw), 1),
                                max_str_len=limits.max_str_bytes, max_bin_len=limits.max_bin_bytes,
                                max_array_len=limits.max_list_items, max_map_len=limits.max_map_entries,
                                max_ext_len=MAX_EXT_BYTES)
    unpacker.feed(raw)
    header = _header(raw, 0)
    if header is None or header[0] != "map":
        return
    try:
        _check_map(unpacker, raw, "", header, limits)
    except (msgpack.OutOfData, msgpack.FormatError, TypeError):
        return


def _check_map(unpacker: msgpack.Unpacker, raw: bytes, path: str, header: tuple[str, int],
               limits: WireLimits) -> None:
    """The map at the unpacker's position (the entry, or `params`), key by key."""
    _check_header(header, path, limits)
    for _ in range(unpacker.read_map_header()):
        key = _unpack(unpacker, path)
        if not isinstance(key, str):
            return  # decoding refuses a key that is not text
        child = f"{path}.{key}" if path else key
        header = _header(raw, unpacker.tell())
        if child == "params" and header is not None and header[0] == "map":
            _check_map(unpacker, raw, child, header, limits)
            continue
        if header is not None:
            _check_header(header, child, limits)
        _unpack(unpacker, child)  # deeper headers: the unpacker's generic limits


def _check_header(header: tuple[str, int], path: str, limits: WireLimits) -> None:
    kind, count = header
    limit = limits.fields.get(path)
    if limit is None:
        return
    most = limit.items if kind in ("map", "array") else limit.size
    if most is not None and count > most:
        raise WireLimitError(f"{path or 'request'} {_amount(kind, count)}; at most {most} "
                             f"{_unit(kind)} are accepted ({limit.source})")


def _unpack(unpacker: msgpack.Unpacker, path: str) -> object:
    try:
        return unpacker.unpack()
    except ValueError as error:  # msgpack says "290000 exceeds max_map_len(4096)" at the header
        found = _MSGPACK_LIMIT.match(str(error))
        if found is None:
            raise msgpack.FormatError(str(error)) from None
        kind = found["kind"]
        raise WireLimitError(f"{path or 'request'} holds {_amount(kind, int(found['count']), nested=True)}; "
                             f"at most {found['most']} {_unit(kind)} are accepted in one "
                             f"{_KIND_NAMES[kind]} on the wire{_GENERIC_SOURCES.get(kind, '')}") from None


_MSGPACK_LIMIT = re.compile(r"^(?P<count>\d+) exceeds max_(?P<kind>str|bin|array|map|ext)_len\((?P<most>\d+)\)$")
_GENERIC_SOURCES = {"bin": " (--max-image-bytes)"}  # the only generic limit a flag sets alone
_KIND_NAMES = {"map": "map", "array": "list", "str": "text", "bin": "binary value", "ext": "extension value"}
_SIZED = {0xD9: ("str", 1), 0xDA: ("str", 2), 0xDB: ("str", 4), 0xC4: ("bin", 1), 0xC5: ("bin", 2),
          0xC6: ("bin", 4), 0xDC: ("array", 2), 0xDD: ("array", 4), 0xDE: ("map", 2), 0xDF: ("map", 4)}


def _header(raw: bytes, offset: int) -> tuple[str, int] | None:
    """(kind, item count or byte length) of the msgpack value at `offset`; None for a scalar."""
    if offset >= len(raw):
        return None
    first = raw[offset]
    if 0x80 <= first <= 0x8F:
        return "map", first & 0x0F
    if 0x90 <= first <= 0x9F:
        return "array", first & 0x0F
    if 0xA0 <= first <= 0xBF:
        return "str", first & 0x1F
    sized = _SIZED.get(first)
    if sized is None:
        return None
    kind, width = sized
    length = bytes(raw[offset + 1:offset + 1 + width])
    return (kind, int.from_bytes(length, "big")) if len(length) == width else None


def _amount(kind: str, count: int, nested: bool = False) -> str:
    """`holds 5 items` / `is 5 bytes long` for a field; `a list of 5 items` for a value inside it."""
    what = f"{count} {_unit(kind)}"
    if nested:
        name = _KIND_NAMES[kind]
        return f"{'an' if name[0] in 'aeiou' else 'a'} {name} of {what}"
    return f"holds {what}" if kind in ("map", "array") else f"is {what} long"


def _unit(kind: str) -> str:
    return {"map": "entries", "array": "items"}.get(kind, "bytes")
