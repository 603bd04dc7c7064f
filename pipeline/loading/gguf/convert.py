"""A GGUF file as an HF-style model directory in the cache, converted once per (file content, dtype).

The directory holds config.json (HF field names), generation_config.json (EOS from the metadata),
model.safetensors (HF tensor names, dequantized to the engine's dtype), the tokenizer files, so
the engine loads it exactly like any HF directory, and gguf_blocks.safetensors (the Q4_0/Q4_1,
Q5_0, Q8_0 and K-quant weights as they are in the file, for `--quantization gguf`:
pipeline/loading/gguf/quant_blocks.py). It lives at
`<cache>/gguf/<file stem>-<dtype>-<key>/`, the key covering the file's bytes, the dtype and the
versions of this converter and of the libraries that shape its output.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog
import torch
from gguf import GGUFReader
from safetensors.torch import save_file

from pipeline.loading.cache_dir import cache_dir as aqueduct_cache_dir
from pipeline.loading.cache_dir import publish_directory
from pipeline.loading.gguf.architectures import gguf_architecture
from pipeline.loading.gguf.file_hash import content_hash
from pipeline.loading.gguf.hf_config import generation_config, hf_config
from pipeline.loading.gguf.joins import join_tensors
from pipeline.loading.gguf.metadata import GgufMetadata
from pipeline.loading.gguf.quant_blocks import write_blocks
from pipeline.loading.gguf.tensors import iter_hf_tensors, rope_freqs
from pipeline.loading.gguf.tokenizer import has_tokenizer, write_tokenizer

log = structlog.get_logger(__name__)

# Bump when a change here changes the files a conversion writes, so stale conversions are not reused.
CONVERTER_VERSION = 5  # 5: Gemma 3 and 4, the MoE families, GLM-4, OLMo 2, Granite, SmolLM3, DeepSeek, Llama 4


def gguf_model_dir(gguf_path: str | Path, dtype: torch.dtype, cache_root: str | Path | None = None) -> Path:
    """The converted directory for `gguf_path` in `dtype`, converting on first use.

    Safe under concurrency: converted in a private staging directory, then renamed into place.
    """
    gguf_path = Path(gguf_path).resolve()
    root = Path(cache_root if cache_root is not None else aqueduct_cache_dir()) / "gguf"
    dtype_name = str(dtype).removeprefix("torch.")
    key = _conversion_key(content_hash(gguf_path, root / "hashes"), dtype_name)
    target = root / f"{gguf_path.stem}-{dtype_name}-{key}"
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        started = time.perf_counter()
        log.info("converting GGUF model", path=str(gguf_path), dtype=dtype_name, target=str(target))
        write_hf_directory(gguf_path, staging, dtype)
        publish_directory(staging, target)
        log.info("GGUF model converted", target=str(target), seconds=round(time.perf_counter() - started, 2))
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def write_hf_directory(gguf_path: Path, out_dir: Path, dtype: torch.dtype) -> None:
    """Write config, generation config, weights and tokenizer of `gguf_path` into existing `out_dir`."""
    reader = GGUFReader(gguf_path, "r")
    metadata = GgufMetadata(reader)
    arch = gguf_architecture(metadata)
    tensor_names = {tensor.name for tensor in reader.tensors}
    config = hf_config(metadata, arch, tensor_names, rope_freqs(reader), str(dtype).removeprefix("torch."))
    weights = join_tensors(arch.joins, dict(iter_hf_tensors(reader, arch, config["num_attention_heads"],
                                                            config["num_key_value_heads"], dtype)), config)
    _match_vocab_to_embeddings(config, weights)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "model.safetensors").chmod(0o644)  # written owner-only; a shared cache must stay readable
    del weights
    write_blocks(reader, arch, config["num_attention_heads"], config["num_key_value_heads"], out_dir)
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", generation_config(metadata))
    if has_tokenizer(metadata):
        write_tokenizer(gguf_path, out_dir, arch.transformers_tokenizer)
    else:
        log.warning("GGUF file has no tokenizer; only prompt_token_ids will be accepted", path=str(gguf_path))


def _match_vocab_to_embeddings(config: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
    """The embedding's row count is what the weights hold; metadata that says otherwise loses. Gemma 4's
    per-layer input embeddings have their own vocabulary, which no key records."""
    rows = weights["model.embed_tokens.weight"].shape[0]
    stated = config.get("vocab_size")
    if stated is not None and stated != rows:
        log.warning("GGUF vocab size differs from the embedding rows; using the rows",
                    metadata_vocab_size=stated, embedding_rows=rows)
    config["vocab_size"] = rows
    if (per_layer := weights.get("model.embed_tokens_per_layer.weight")) is not None:
        config["vocab_size_per_layer_input"] = per_layer.shape[0]


def _conversion_key(content_digest: str, dtype_name: str) -> str:
    digest = hashlib.sha256(f"{content_digest} {dtype_name} converter {CONVERTER_VERSION}".encode())
    # transformers builds the tokenizer files, gguf dequantizes: a new version may write other bytes.
    for package in ("transformers", "gguf"):
        digest.update(f" {package} {importlib.metadata.version(package)}".encode())
    return digest.hexdigest()[:16]


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
