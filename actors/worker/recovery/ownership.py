"""Idempotency across workers: one owner per request id.

`{prefix}:owner:{id}` names the worker generating a request (SET NX). A second entry with the same
id, on any worker, finds a live owner and is acked without generating again; the client reads the
one reply stream. An owner whose heartbeat is gone is replaced, and the new owner resumes.

The owner key lives as long as the request's reply stream: set for `ttl_s` when taken, and given
`ttl_s` again with the final reply entry (RedisReplySink). So a FRESH claim, no owner key at all,
on a first delivery means no reply stream of this id is left, and the worker skips reading it: on
a reply stream shared by many requests that read costs the whole stream, once per admitted
request. (A request left unfinished longer than `ttl_s` is the exception; its pending entry is
claimed, a redelivery, long before: redeliveries always read.)

The owner key also holds the request's fingerprint (`fingerprint_of`: a hash of what it asks,
not of when it was sent), as `{fingerprint}\\n{worker}`. An entry whose id is held with another
fingerprint is a CONFLICT: a different request reusing the id, which must neither attach to nor
write into the first one's reply stream. A resubmission of the same request attaches as before.

An owner key also guards its id's reply stream, `{prefix}:out:{id}`, when other requests name that
stream in `reply_to` (actors/worker/reply_routes.py): such a request claims the key as SHARED_STREAM,
which fails (STREAM_TAKEN) while a request holds it, and a request with that id is a CONFLICT while
the stream is shared. So one key says who may write a stream: its request, or the requests sharing it.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Sequence

import msgpack
import msgspec
import redis.asyncio as aioredis

from actors.worker.recovery.liveness import heartbeat_key
from queue_adapters.codec import ID_PATTERN, MAX_ID_LENGTH


class Claim(enum.Enum):
    FRESH = "fresh"  # nobody held the id: a new request
    TAKEN = "taken"  # held before, by this worker or a dead one: its reply stream tells how far it got
    ELSEWHERE = "elsewhere"  # a live worker holds it: that worker answers it
    CONFLICT = "conflict"  # held by a different request (another fingerprint), or its stream is shared
    STREAM_TAKEN = "stream_taken"  # the id is claimed, but its reply_to is another request's own stream


SHARED_STREAM = "shared reply stream"  # an owner key's value while other requests share its id's stream

# Claims many ids in one round trip, each atomically. KEYS: owner keys. ARGV: this worker, ttl
# seconds, the heartbeat key prefix (owner names are only known here, so their heartbeat keys are
# built in the script: one Redis node, as the worker's other scripts need), the owner key prefix,
# the shared-stream marker, then one fingerprint per key ("" matches any), then per key the id whose
# stream its reply_to shares ("" when none). A value without a fingerprint (written before they
# existed) matches any.
_CLAIM = """
local worker, ttl, heartbeat_prefix, owner_prefix, shared = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local function claim(key, fingerprint)
  local value = fingerprint .. '\\n' .. worker
  if redis.call('SET', key, value, 'NX', 'EX', ttl) then
    return 'fresh'
  end
  local held = redis.call('GET', key) or ''
  if held == shared then
    return 'conflict'
  end
  local held_fingerprint, owner = string.match(held, '^(%x*)\\n(.*)$')
  if not owner then
    held_fingerprint, owner = '', held
  end
  if fingerprint ~= '' and held_fingerprint ~= '' and held_fingerprint ~= fingerprint then
    return 'conflict'
  elseif owner ~= '' and owner ~= worker and redis.call('EXISTS', heartbeat_prefix .. owner) == 1 then
    return 'elsewhere'
  end
  redis.call('SET', key, value, 'EX', ttl)
  return 'taken'
end
local function share(owner_id)
  local key = owner_prefix .. owner_id
  local held = redis.call('GET', key)
  if held and held ~= shared then
    return false
  end
  redis.call('SET', key, shared, 'EX', ttl)
  return true
end
local claims = {}
for i, key in ipairs(KEYS) do
  claims[i] = claim(key, ARGV[5 + i])
  local shares = ARGV[5 + #KEYS + i]
  if shares ~= '' and (claims[i] == 'fresh' or claims[i] == 'taken') and not share(shares) then
    claims[i] = 'stream_taken'
  end
end
return claims
"""
_sorted_encoder = msgspec.msgpack.Encoder(order="sorted")
_ID = re.compile(ID_PATTERN)


def stream_owner_id(reply_to: str, prefix: str) -> str | None:
    """The request id whose own reply stream `reply_to` is (`{prefix}:out:{id}`), or None."""
    head = f"{prefix}:out:"
    if not reply_to.startswith(head):
        return None
    candidate = reply_to[len(head):]
    return candidate if len(candidate) <= MAX_ID_LENGTH and _ID.match(candidate) else None


def fingerprint_of(request: msgspec.Struct) -> str:
    """What a wire request asks (every field but `deadline_ms`, which a client's retry recomputes),
    in a canonical encoding (map keys sorted), hashed."""
    asked = msgspec.structs.replace(request, deadline_ms=None)
    try:
        canonical = _sorted_encoder.encode(asked)
    except UnicodeEncodeError:  # a lone surrogate in an in-process request: its build refuses it later
        canonical = msgpack.packb(msgspec.to_builtins(asked, order="sorted"), unicode_errors="surrogatepass")
    return hashlib.sha256(canonical).hexdigest()[:32]


class Ownership:
    def __init__(self, redis: aioredis.Redis, prefix: str, worker: str, ttl_s: int) -> None:
        self.redis = redis
        self.prefix = prefix
        self.worker = worker
        self.ttl_s = ttl_s
        self._claim = redis.register_script(_CLAIM)

    def key(self, request_id: str) -> str:
        return f"{self.prefix}:owner:{request_id}"

    def stream_key(self, reply_to: str) -> str | None:
        """The owner key that guards this reply stream: its request's, or the sharers' (None: no id's)."""
        request_id = stream_owner_id(reply_to, self.prefix)
        return self.key(request_id) if request_id is not None else None

    async def claim(self, request_ids: Sequence[str], fingerprints: Sequence[str] | None = None,
                    shared_streams: Sequence[str] | None = None) -> list[Claim]:
        """One claim per id, in order (one round trip for a whole read of requests); `fingerprints`
        (fingerprint_of each request) turns an id held by a different request into CONFLICT;
        `shared_streams` (per request, the other id whose stream its reply_to is, or "") claims that
        stream as shared, or answers STREAM_TAKEN while a request holds it."""
        if not request_ids:
            return []
        fingerprints = list(fingerprints) if fingerprints is not None else [""] * len(request_ids)
        shared_streams = list(shared_streams) if shared_streams is not None else [""] * len(request_ids)
        results = await self._claim(keys=[self.key(request_id) for request_id in request_ids],
                                    args=[self.worker, self.ttl_s, heartbeat_key(self.prefix, ""), self.key(""),
                                          SHARED_STREAM, *fingerprints, *shared_streams])
        return [Claim(result.decode() if isinstance(result, bytes) else result) for result in results]
