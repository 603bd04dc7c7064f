"""Tokenizer loading: the model directory's HF tokenizer, resolved once, then reused without transformers.

Importing transformers costs 0.4-1 s of start-up on a small CPU box (it reads every model file of
the package to build its lazy import table). A tokenizers-backed HF tokenizer encodes and decodes
by calling its Rust backend, after transformers has set that backend up (post-processor for BOS/
EOS, added and special tokens, truncation and padding off). So the first load goes through
transformers and saves the set-up backend as a snapshot in the cache; later starts load the
snapshot with the `tokenizers` library alone. What the backend cannot do by itself (rendering
chat templates) loads the HF tokenizer on first use.

A snapshot is written only when it gives the HF tokenizer's results: the class must encode and
decode through TokenizersBackend's own methods, decode must not post-process the text, and the
two must agree on a probe string. It is keyed by the tokenizer files' bytes and the transformers
and tokenizers versions, so an edited file or an upgrade resolves afresh.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import structlog

from pipeline.loading.cache_dir import cache_dir as aqueduct_cache_dir
from pipeline.loading.hub_model import TOKENIZER_FILES, hub_model_dir, looks_like_hub_id

log = structlog.get_logger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
# Every file transformers may read to build a tokenizer (the snapshot key covers them all).
_KEY_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
              "chat_template.jinja", "chat_template.json", "vocab.json", "vocab.txt", "merges.txt",
              "tokenizer.model", "config.json")
SNAPSHOT_FORMAT = 1
_PROBE = "Probe: The river's 12 bends, ünïcødé ✓ 東京 😀\n\n  spaces\t"


class Tokenizer(Protocol):
    """What the engine needs from a tokenizer (an HF tokenizer satisfies it)."""

    chat_template: Any

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> Any: ...


class SnapshotTokenizer:
    """An HF tokenizer's set-up Rust backend, loaded from a snapshot; HF itself only for chat templates."""

    clean_up_tokenization_spaces = False  # snapshots exist only for tokenizers that do not clean up

    def __init__(self, backend: Any, chat_template: Any, model_dir: Path) -> None:
        self.backend_tokenizer = backend
        self.chat_template = chat_template
        self._model_dir = model_dir
        self._hf: Any | None = None
        # Chat templates render on worker threads: two first renders at once would import
        # transformers' lazy modules concurrently, which fails ("cannot import name AutoTokenizer").
        self._hf_loading = threading.Lock()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: int | Sequence[int], skip_special_tokens: bool = False, **_hf_options: bool) -> str:
        # HF options the Rust decoder does not have (spaces_between_special_tokens) change nothing
        # for a fast tokenizer in transformers either.
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        return self.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> Any:
        if self._hf is None:
            with self._hf_loading:
                if self._hf is None:
                    log.info("loading the transformers tokenizer for chat templates", model=str(self._model_dir))
                    self._hf = load_hf_tokenizer(self._model_dir)
        if isinstance(self.chat_template, str):  # the snapshot's, or one set over it (--chat-template)
            kwargs.setdefault("chat_template", self.chat_template)
        return self._hf.apply_chat_template(messages, **kwargs)


def load_served_tokenizer(model_dir: str | Path, tokenizer_dir: str | None, chat_template: str | None) -> Any:
    """The tokenizer a deployment serves with: the model's, or `tokenizer_dir`'s (--tokenizer), with
    `chat_template` (--chat-template's text) in place of its own when given."""
    tokenizer = load_tokenizer(_tokenizer_source(tokenizer_dir) if tokenizer_dir is not None else model_dir)
    if tokenizer is not None and chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def _tokenizer_source(tokenizer: str) -> Path:
    """--tokenizer: a directory, or a Hub id whose tokenizer files are fetched into the HF cache."""
    if Path(tokenizer).expanduser().is_dir():
        return Path(tokenizer).expanduser()
    if looks_like_hub_id(tokenizer):
        try:
            return hub_model_dir(tokenizer, TOKENIZER_FILES)
        except ValueError as error:
            raise ValueError(f"--tokenizer {error}") from None
    raise ValueError(f"--tokenizer {tokenizer!r} is neither a directory nor a Hub id (org/name)")


def tokenizer_vocab_size(tokenizer: Any) -> int:
    """Ids a tokenizer can decode: its vocabulary with added tokens (HF's len(), the Rust backend's
    count); 2**31 when it tells neither, so an id still fits the decoder's 32-bit type."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return int(backend.get_vocab_size(with_added_tokens=True))
    try:
        return len(tokenizer)
    except TypeError:
        return 2**31


def load_tokenizer(model_dir: str | Path, cache_dir: str | Path | None = None) -> Tokenizer | None:
    """model_dir's tokenizer (from its snapshot when there is one); None when the directory has none."""
    model_dir = Path(model_dir)
    if not any((model_dir / name).exists() for name in _TOKENIZER_FILES):
        log.warning("model has no tokenizer; only prompt_token_ids are accepted", model=str(model_dir))
        return None
    path = _snapshot_path(model_dir, Path(cache_dir) if cache_dir is not None else aqueduct_cache_dir())
    snapshot = _read_snapshot(path, model_dir)
    if snapshot is not None:
        return snapshot
    tokenizer = load_hf_tokenizer(model_dir)
    _write_snapshot(path, tokenizer)
    return tokenizer


def load_hf_tokenizer(model_dir: str | Path) -> Any:
    """AutoTokenizer's choice, whatever the class tokenizer_config.json names: transformers overrides
    that name in places (e.g. a LlamaTokenizer declared over a byte-level tokenizer.json)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def _snapshot_path(model_dir: Path, cache_root: Path) -> Path:
    digest = hashlib.sha256(f"format {SNAPSHOT_FORMAT}".encode())
    for package in ("transformers", "tokenizers"):
        try:
            digest.update(f"{package} {importlib.metadata.version(package)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{package} missing".encode())
    for name in _KEY_FILES:
        path = model_dir / name
        if path.is_file():
            digest.update(f"{name} {path.stat().st_size}".encode())
            digest.update(path.read_bytes())
    return cache_root / "tokenizers" / f"{digest.hexdigest()[:32]}.json"


def _read_snapshot(path: Path, model_dir: Path) -> SnapshotTokenizer | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        log.warning("unreadable tokenizer snapshot; resolving again", path=str(path), error=str(error))
        return None
    try:
        from tokenizers import Tokenizer as Backend

        backend = Backend.from_str(data["backend"])
        backend.encode_special_tokens = bool(data["split_special_tokens"])
        return SnapshotTokenizer(backend, data["chat_template"], model_dir)
    except Exception as error:  # any bad snapshot means: go through transformers again
        log.warning("bad tokenizer snapshot; resolving again", path=str(path), error=str(error))
        return None


def _write_snapshot(path: Path, tokenizer: Any) -> None:
    data = _snapshot_of(tokenizer)
    if data is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, suffix=".tmp",
                                         delete=False) as staging:
            json.dump(data, staging)
        os.replace(staging.name, path)  # atomic: a concurrent reader sees no file or a whole one
    except OSError as error:
        log.warning("could not save the tokenizer snapshot", path=str(path), error=str(error))


def _snapshot_of(tokenizer: Any) -> dict[str, Any] | None:
    """The snapshot of an HF tokenizer, or None when its backend alone would not give its results."""
    from tokenizers import Tokenizer as Backend
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    if not isinstance(tokenizer, TokenizersBackend) or tokenizer.clean_up_tokenization_spaces:
        return None
    if any(getattr(type(tokenizer), name) is not getattr(TokenizersBackend, name)
           for name in ("encode", "_encode_plus", "decode", "_decode")):
        return None  # the class changes encoding or decoding beyond the backend
    chat_template = tokenizer.chat_template
    if not isinstance(chat_template, str | dict | None):
        return None
    backend = Backend.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()  # what HF's encode sets for a call without truncation or padding
    backend.no_padding()
    backend.encode_special_tokens = bool(tokenizer.split_special_tokens)
    probe = _PROBE + "".join(str(token) for token in tokenizer.all_special_tokens)
    ids = tokenizer.encode(probe)
    if backend.encode(probe).ids != ids or any(
            backend.decode(ids, skip_special_tokens=skip) != tokenizer.decode(ids, skip_special_tokens=skip)
            for skip in (False, True)):
        log.warning("tokenizer backend disagrees with transformers; no snapshot", tokenizer=type(tokenizer).__name__)
        return None
    return {"format": SNAPSHOT_FORMAT, "class": type(tokenizer).__name__, "backend": backend.to_str(),
            "split_special_tokens": bool(tokenizer.split_special_tokens), "chat_template": chat_template}
