"""HF tokenizer files from a GGUF's tokenizer metadata, through transformers' GGUF converter.

A GGUF carries its tokenizer as metadata (`tokenizer.ggml.*`: tokens, token types, merges, special
ids, chat template). transformers rebuilds the fast tokenizer from it; saving that tokenizer
writes tokenizer.json, tokenizer_config.json (BOS/EOS/pad by name) and the chat template, which is
what pipeline/loading/tokenizer.py loads from any HF directory.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from pipeline.loading.gguf.metadata import GgufMetadata

log = structlog.get_logger(__name__)


def has_tokenizer(metadata: GgufMetadata) -> bool:
    return metadata.get("tokenizer.ggml.model") is not None


def write_tokenizer(gguf_path: Path, out_dir: Path, by_architecture: bool = True) -> None:
    """by_architecture: transformers knows the file's architecture and picks its tokenizer class
    (AutoTokenizer); otherwise (its GGUF reader refuses the architecture: OLMo 2, Granite, SmolLM3,
    GLM-4, DeepSeek, Llama 4) the tokenizer is built from `tokenizer.ggml.model` alone, which is what
    AutoTokenizer does for a known architecture without a class of its own (gpt-oss)."""
    # Imported here: transformers takes seconds to import, and only a conversion needs it.
    from transformers import AutoTokenizer, TokenizersBackend

    builder = AutoTokenizer if by_architecture else TokenizersBackend
    try:
        tokenizer = builder.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as error:  # transformers raises many types here; the cause is always this file
        raise ValueError(f"{gguf_path.name}: transformers cannot build a tokenizer from its metadata: "
                         f"{type(error).__name__}: {error}") from error
    tokenizer.save_pretrained(str(out_dir))
    log.info("tokenizer converted from GGUF metadata", tokenizer=type(tokenizer).__name__,
             has_chat_template=bool(tokenizer.chat_template), eos_token=tokenizer.eos_token)
