"""Wire protocol v1 (docs/design.md §3): msgpack maps as msgspec Structs that validate on decode.

Unknown keys are rejected at every level (a typo never silently does nothing), and every
decode failure is a CodecError whose message names the field and the rule, e.g.
`prompt_token_ids[3] must be >= 0`. When the entry is at least a msgpack map with a usable
`id`, the error carries it (and `reply_to`) so a worker can answer with an error reply
instead of only dead-lettering.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgpack
import msgspec
from msgspec import Meta, Struct

from pipeline.request.chat_template_kwargs import check_chat_template_kwargs
from pipeline.request.sampling_params import SamplingParams
from pipeline.request.tools import MAX_TOOLS, arguments_object, check_tools
from pipeline.request.untrusted import INT64_MAX, UntrustedValueError, check_untrusted
from queue_adapters.chat_message import ChatMessage, check_tool_roles
from queue_adapters.wire_limits import WireLimitError, WireLimits, check_wire_limits

ID_PATTERN = r"^[A-Za-z0-9._:-]+$"
# A client's id is at most 128 characters (X-Request-Id); the wire's allows a gateway's tenant namespace
# (actors/http/tenancy/id_namespaces.py) and a prompt's `:index` after it.
MAX_ID_LENGTH = 160
MAX_KEY_LENGTH = 512  # reply_to is a Redis key; long enough for any prefix, short enough to refuse junk

RequestId = Annotated[str, Meta(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN)]
StreamKey = Annotated[str, Meta(min_length=1, max_length=MAX_KEY_LENGTH)]
NonNegativeInt = Annotated[int, Meta(ge=0, le=INT64_MAX)]
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1  # vLLM takes any int; 32 bits are plenty
MAX_TENANT_LENGTH = 128
TENANT_PATTERN = r"^[^\x00-\x1f\x7f]+$"  # printable: it is a metrics label and a log field
MIN_TENANT_WEIGHT, MAX_TENANT_WEIGHT = 0.001, 1000.0  # a share's cost / weight stays a plain float
FinishReason = Literal["stop", "length", "abort", "timeout", "error"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort", "timeout", "error")
PROMPT_FIELDS: tuple[str, ...] = ("prompt", "prompt_token_ids", "messages")


class CodecError(ValueError):
    """An entry that is not a valid v1 message; `request_id`/`reply_to` are set when readable."""

    def __init__(self, message: str, request_id: str | None = None, reply_to: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.reply_to = reply_to


class _Wire(Struct, forbid_unknown_fields=True, kw_only=True):
    """Unknown keys are an error at every level (as in queue_adapters/chat_message.py)."""


class WireRequest(_Wire, omit_defaults=True):
    id: RequestId
    prompt: str | None = None
    prompt_token_ids: list[NonNegativeInt] | None = None
    messages: list[ChatMessage] | None = None
    params: dict[str, Any] = {}
    lora: Annotated[str, Meta(min_length=1)] | None = None
    reply_to: StreamKey | None = None
    deadline_ms: NonNegativeInt | None = None
    images: list[bytes] | None = None  # encoded images (PNG, JPEG, ...), one per <image> placeholder
    tools: Annotated[list[Any], Meta(min_length=1, max_length=MAX_TOOLS)] | None = None  # for the chat template
    chat_template_kwargs: dict[str, Any] | None = None  # extra template variables (enable_thinking, ...)
    # Lower is more urgent (vLLM's meaning): the lane it is queued on and the worker's scheduling order.
    priority: Annotated[int, Meta(ge=PRIORITY_MIN, le=PRIORITY_MAX)] = 0
    # Who sent it (the gateway sets the API key's tenant; none: the default tenant) and its weight: equal
    # priorities share a worker's admissions between tenants in proportion to their weights.
    tenant: Annotated[str, Meta(min_length=1, max_length=MAX_TENANT_LENGTH, pattern=TENANT_PATTERN)] | None = None
    tenant_weight: Annotated[float, Meta(ge=MIN_TENANT_WEIGHT, le=MAX_TENANT_WEIGHT)] = 1.0
    # An embedding request (a worker started with --runner pooling): the prompt's pooled vector, its
    # first `dimensions` entries when given (docs/http-api.md#embeddings); nothing is generated.
    embed: bool = False
    dimensions: Annotated[int, Meta(ge=1, le=INT64_MAX)] | None = None

    def sampling_params(self) -> SamplingParams:
        return SamplingParams.from_dict(self.params)


class WireChoice(_Wire):
    index: NonNegativeInt = 0
    token_ids: list[NonNegativeInt] = []
    text: str = ""
    logprobs: list[Any] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    # Mirostat requests: the choice's mu after these tokens, so a worker that resumes the request
    # continues from it (docs/design.md §5); nil otherwise.
    mirostat_mu: float | None = None


class WireUsage(_Wire):
    prompt_tokens: NonNegativeInt
    completion_tokens: NonNegativeInt
    cached_tokens: NonNegativeInt = 0


class WireError(_Wire):
    code: str
    message: str


class WireReply(_Wire):
    id: RequestId
    seq: NonNegativeInt
    choices: list[WireChoice] = []
    usage: WireUsage | None = None
    # On the first entry: the prompt's length, so a stream can report usage before the final entry.
    prompt_tokens: NonNegativeInt | None = None
    error: WireError | None = None
    # Once, when the request asked for them: one entry per prompt token (nil for the first).
    prompt_logprobs: list[Any] | None = None
    prompt_token_ids: list[NonNegativeInt] | None = None  # with prompt_logprobs: the prompt as tokenized
    embedding: bytes | None = None  # an embedding request's vector: little-endian float32

    @property
    def is_error(self) -> bool:
        return self.error is not None


class WireCancel(_Wire):
    cancel: RequestId


AdapterName = Annotated[str, Meta(min_length=1, max_length=MAX_KEY_LENGTH)]


class WireLoadLora(_Wire):
    name: AdapterName
    path: Annotated[str, Meta(min_length=1)]


class WireControl(_Wire, omit_defaults=True):
    """A control entry: exactly one of cancel, load_lora, unload_lora. A load or unload is answered
    by every worker on `reply_to` (default `{prefix}:control:results`), tagged with `id` if given."""

    cancel: RequestId | None = None
    load_lora: WireLoadLora | None = None
    unload_lora: AdapterName | None = None
    id: RequestId | None = None
    reply_to: StreamKey | None = None


class WireControlResult(_Wire, omit_defaults=True):
    """A worker's answer to a load_lora or unload_lora entry."""

    worker: str
    op: Literal["load_lora", "unload_lora", "invalid"]
    ok: bool
    id: RequestId | None = None
    adapter: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Malformed:
    """Marker a consumer delivers instead of crashing on an entry it cannot decode.

    `raw` is None when the entry had no `data` field. The caller replies with an error when
    `request_id` is known, and dead-letters the entry otherwise (or in any case)."""

    raw: bytes | None
    error: str
    entry_id: str | None = None
    request_id: str | None = None
    reply_to: str | None = None

    @classmethod
    def from_error(cls, raw: bytes | None, error: Exception, entry_id: str | None = None) -> Malformed:
        if isinstance(error, CodecError):
            return cls(raw, str(error), entry_id, error.request_id, error.reply_to)
        return cls(raw, f"{type(error).__name__}: {error}", entry_id)


_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(WireRequest)
_reply_decoder = msgspec.msgpack.Decoder(WireReply)
_cancel_decoder = msgspec.msgpack.Decoder(WireCancel)
_control_decoder = msgspec.msgpack.Decoder(WireControl)


def encode(message: Struct | dict[str, Any]) -> bytes:
    return _encoder.encode(message)


def decode_request(raw: bytes, *, params_checked: bool = False, limits: WireLimits | None = None) -> WireRequest:
    """`params_checked`: the sender built `params` with SamplingParams.from_dict already (the gateway's
    body parsers do), so only the message's shape and prompt are checked here: that check is the
    slowest part of decoding and would run twice before the request is queued. `limits`: sizes
    checked on the msgpack headers before anything is decoded (a worker's, from its configuration)."""
    if limits is not None:
        _check_limits(raw, limits)
    request = _decode(_request_decoder, raw, "request")
    check_request(request, params_checked=params_checked)
    return request


def check_request(request: WireRequest, *, params_checked: bool = False) -> None:
    """The rules a decoded request must meet beyond its shape (one prompt field, not empty; tools
    renderable; params plain and valid): workers run them on every entry, and the gateway on the
    requests it builds before it encodes them, so what a worker would refuse is the client's 400."""
    try:
        _check_prompt(request)
        _check_tools(request)
        _check_untrusted_params(request.params)
        if not params_checked:
            _check_params(request.params)
    except CodecError as error:
        raise CodecError(str(error), request.id, request.reply_to) from None


def _check_limits(raw: bytes, limits: WireLimits) -> None:
    if not isinstance(raw, bytes | bytearray | memoryview):
        return  # _decode names the type
    try:
        check_wire_limits(raw, limits)
    except WireLimitError as error:
        raise CodecError(str(error), *peek_ids(raw)) from None


def decode_reply(raw: bytes) -> WireReply:
    return _decode(_reply_decoder, raw, "reply")


def decode_cancel(raw: bytes) -> WireCancel:
    return _decode(_cancel_decoder, raw, "control entry")


def decode_control(raw: bytes) -> WireControl:
    control = _decode(_control_decoder, raw, "control entry")
    given = [key for key in ("cancel", "load_lora", "unload_lora") if getattr(control, key) is not None]
    if len(given) != 1:
        raise CodecError("control entry must hold exactly one of cancel, load_lora, unload_lora, "
                         f"got {given or 'none'}", control.id, control.reply_to)
    return control


def _decode(decoder: msgspec.msgpack.Decoder[Any], raw: bytes, what: str) -> Any:
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise CodecError(f"{what} data must be bytes, got {type(raw).__name__}")
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as error:
        request_id, reply_to = peek_ids(raw)
        fields = msgspec.structs.fields(decoder.type)
        message = readable_validation_error(str(error), what, tuple(f.encode_name for f in fields))
        raise CodecError(message, request_id, reply_to) from None
    except msgspec.DecodeError as error:  # e.g. invalid UTF-8 in one text: the id may still be readable
        request_id, reply_to = peek_ids(raw)
        raise CodecError(f"{what} data is not valid msgpack: {error}", request_id, reply_to) from None
    except RecursionError:  # msgspec's own depth limit, on maps and lists inside `Any` fields
        request_id, reply_to = peek_ids(raw)
        raise CodecError(f"{what} data is nested too deeply", request_id, reply_to) from None


def _check_prompt(request: WireRequest) -> None:
    given = [name for name in PROMPT_FIELDS if getattr(request, name) is not None]
    if len(given) != 1:
        found = ", ".join(given) if given else "none"
        raise CodecError(f"exactly one of {', '.join(PROMPT_FIELDS)} is required, got {found}")
    if not getattr(request, given[0]):
        raise CodecError(f"{given[0]} must not be empty")


def _check_tools(request: WireRequest) -> None:
    """Tools, tool calls and template variables only come with chat messages, and hold what a chat
    template can render."""
    if request.tools is not None and request.messages is None:
        raise CodecError("tools need messages (they are rendered by the chat template)")
    try:
        if request.tools is not None:
            check_tools(request.tools)
        if request.chat_template_kwargs is not None:
            if request.messages is None:
                raise ValueError("chat_template_kwargs need messages (they are the chat template's variables)")
            check_chat_template_kwargs(request.chat_template_kwargs)
        for index, message in enumerate(request.messages or []):
            check_tool_roles(message, f"messages[{index}]")
            for number, call in enumerate(message.tool_calls or []):
                arguments_object(call.function.arguments,
                                 f"messages[{index}].tool_calls[{number}].function.arguments")
    except ValueError as error:
        raise CodecError(str(error)) from None


def _check_untrusted_params(params: dict[str, Any]) -> None:
    """`params` is a free map on the wire: every value in it must still be plain, finite, 64-bit,
    valid text and shallow (pipeline/request/untrusted.py), whoever sent it."""
    try:
        check_untrusted(params, "params")
    except UntrustedValueError as error:
        raise CodecError(str(error)) from None


def _check_params(params: dict[str, Any]) -> None:
    known = SamplingParams.__dataclass_fields__
    unknown = sorted(key for key in params if key not in known)
    if unknown:
        names = ", ".join(f"params.{key}" for key in unknown)
        raise CodecError(f"unknown sampling parameter(s): {names} (known: {', '.join(sorted(known))})")
    try:
        SamplingParams.from_dict(params)
    except (ValueError, TypeError) as error:
        # SamplingParams messages start with the field name: `max_tokens must be >= 1, got 0`.
        raise CodecError(f"params.{error}") from None


def peek_ids(raw: bytes) -> tuple[str | None, str | None]:
    """Best-effort (id, reply_to) of an invalid entry, each None unless it is a valid value.

    Only the top-level map is read, and only those two values are decoded; the rest is skipped
    undecoded, so an entry with invalid text or absurd nesting elsewhere still gets its error reply."""
    found: dict[bytes, Any] = {}
    # Limits: an absurd id or reply_to is refused at its header, not copied (skip() ignores them).
    unpacker = msgpack.Unpacker(raw=True, max_buffer_size=max(len(raw), 1), max_str_len=4 * MAX_KEY_LENGTH,
                                max_bin_len=4 * MAX_KEY_LENGTH)
    unpacker.feed(raw)
    try:
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if key in (b"id", b"reply_to"):
                found[key] = unpacker.unpack()
            else:
                unpacker.skip()
    except (ValueError, TypeError, msgpack.OutOfData):  # not a map, truncated, or too deep to skip
        pass
    request_id = _valid_or_none(_text(found.get(b"id")), RequestId)
    reply_to = _valid_or_none(_text(found.get(b"reply_to")), StreamKey) if request_id else None
    return request_id, reply_to


def _text(value: Any) -> str | None:
    """A msgpack str read raw (bytes) as text; None for anything else or invalid UTF-8. A bin value
    reads as bytes too, which is why the id is also validated against RequestId afterwards."""
    if not isinstance(value, bytes):
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _valid_or_none(value: Any, kind: Any) -> str | None:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError:
        return None


# --- turning msgspec's `Expected ... - at `$.path`` into `path must be ...` -------------------

_LOCATION = re.compile(r"^(?P<body>.*?)(?: - at `(?P<where>[^`]*)`(?: in `(?P<container>[^`]*)`)?)?$", re.S)
_KINDS = {"str": "a string", "int": "an int", "float": "a number", "bool": "a bool", "object": "a map",
          "array": "a list", "null": "nil", "bytes": "bytes", "ext": "a msgpack extension"}
_ALLOWED_VALUES = {"finish_reason": FINISH_REASONS, "type": ("text", "image", "image_url"), "detail": ("auto",)}
_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`"), "{field} must be {want}, got {got}"),
    (re.compile(r"Expected `[^`]+` of length (?P<op>\S+) (?P<n>\d+)"), "{field} must have length {op} {n}"),
    (re.compile(r"Expected `str` matching regex '(?P<regex>.*)'"), "{field} must match {regex}"),
    (re.compile(r"Expected `[^`]+` (?P<op>[<>]=?) (?P<n>\S+)"), "{field} must be {op} {n}"),
    (re.compile(r"Object contains unknown field `(?P<name>[^`]+)`"), "{child} is not a known field{known}"),
    (re.compile(r"Object missing required field `(?P<name>[^`]+)`"), "{child} is required"),
    (re.compile(r"Invalid enum value (?P<value>.+)"), "{field} must be one of {allowed}, got {value}"),
    (re.compile(r"Invalid value (?P<value>.+)"), "{field} must be one of {allowed}, got {value}"),
]


def readable_validation_error(message: str, root: str, root_fields: tuple[str, ...] = ()) -> str:
    """`Expected `int` >= 0 - at `$.prompt_token_ids[3]`` -> `prompt_token_ids[3] must be >= 0`."""
    located = _LOCATION.match(message)
    body, where, container = (located["body"], located["where"], located["container"]) if located else (
        message, None, None)
    is_key = where == "key" and container is not None
    path = ((container if is_key else where) or "$").removeprefix("$").removeprefix(".")
    field = f"{path or root} keys" if is_key else (path or root)
    for pattern, template in _RULES:
        found = pattern.search(body)
        if found:
            return template.format(**_template_values(found.groupdict(), path, field, root_fields))
    return f"{field}: {body}"


def _template_values(groups: dict[str, str], path: str, field: str, root_fields: tuple[str, ...]) -> dict[str, str]:
    values = dict(groups)
    for key in ("want", "got"):
        if key in values:
            values[key] = " or ".join(_KINDS.get(part, part) for part in values[key].split(" | "))
    name = values.get("name", "")
    values["child"] = f"{path}.{name}" if path else name
    values["known"] = f" (known: {', '.join(root_fields)})" if root_fields and not path else ""
    last = re.sub(r"\[\d+\]$", "", field).rsplit(".", 1)[-1]
    values["allowed"] = ", ".join(_ALLOWED_VALUES.get(last, ())) or "the allowed values"
    return {"field": field, **values}
