"""Tokenizer loading: the model directory's HF tokenizer, or None when it ships none."""

from __future__ import annotations

import json
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def load_tokenizer(model_dir: str | Path) -> object | None:
    """The HF tokenizer of model_dir; None (token-id prompts only) when the directory has no tokenizer."""
    model_dir = Path(model_dir)
    if not any((model_dir / name).exists() for name in _TOKENIZER_FILES):
        log.warning("model has no tokenizer; only prompt_token_ids are accepted", model=str(model_dir))
        return None
    tokenizer_class = _named_tokenizer_class(model_dir)
    if tokenizer_class is not None:
        return tokenizer_class.from_pretrained(str(model_dir))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def _named_tokenizer_class(model_dir: Path) -> type | None:
    """The class tokenizer_config.json names, when transformers exports it and it is a fast one.

    AutoTokenizer would resolve the same class, but it first loads the model's config class, which
    imports much of torch.distributed: about a second of start-up on a small CPU box.
    """
    try:
        name = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(name, str) or not (model_dir / "tokenizer.json").exists():
        return None
    import transformers

    try:
        tokenizer_class = getattr(transformers, name)
    except (AttributeError, ImportError):
        return None
    # Only classes backed by the Rust `tokenizers` library: they all load from tokenizer.json alone.
    fast_base = getattr(transformers, "PreTrainedTokenizerFast", None)
    if not isinstance(tokenizer_class, type) or fast_base is None or not issubclass(tokenizer_class, fast_base):
        return None
    return tokenizer_class
