"""Tokenizer loading: the model directory's HF tokenizer, or None when it ships none."""

from __future__ import annotations

from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def load_tokenizer(model_dir: str | Path) -> object | None:
    """AutoTokenizer for model_dir; None (token-id prompts only) when the directory has no tokenizer."""
    model_dir = Path(model_dir)
    if not any((model_dir / name).exists() for name in _TOKENIZER_FILES):
        log.warning("model has no tokenizer; only prompt_token_ids are accepted", model=str(model_dir))
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))
