"""Encoding of the plain-data actor messages, so any such edge can run over Redis Streams.

An entry is msgpack [type name, fields]; decoding rebuilds (and so re-validates) the dataclass.
Only the types listed here can cross a process: device tensors (GPU -> Sampling) and ack handles
(Intake -> Output) cannot, by design.
"""

from __future__ import annotations

from typing import Any

import msgspec

from actors.kit.messages import Admit, Cancel, Embed, Embedded, EmbedStopped, RequestFailed, StepEvents
from pipeline.request.outputs import StopStringFinish
from pipeline.step.plan import StepPlan
from pipeline.step.result import StepResult

_TYPES: dict[str, type] = {cls.__name__: cls for cls in (Admit, Cancel, Embed, Embedded, EmbedStopped, RequestFailed,
                                                          StepEvents, StopStringFinish, StepPlan, StepResult)}
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(tuple[str, Any])


def encode_message(message: Any) -> bytes:
    name = type(message).__name__
    if name not in _TYPES:
        raise TypeError(f"{name} cannot cross a process boundary (only {', '.join(sorted(_TYPES))})")
    return _encoder.encode((name, message))


def decode_message(raw: bytes) -> Any:
    name, fields = _decoder.decode(raw)
    if name not in _TYPES:
        raise ValueError(f"unknown actor message type {name!r}")
    return msgspec.convert(fields, _TYPES[name], strict=False)
