"""EmbeddingEngine: the pooling runner (`--runner pooling`): prompts in, one vector each out.

Embeddings need no scheduler, sampler or detokenizer: a batch of prompts is embedded in one call,
by an encoder family's padded forward (model/encoder_runner.py) or a decoder family's chunked
prefill over its paged cache (model/decoder_pooling.py), pooled as the model directory says
(loading/pooling_config.py). `dimensions` keeps a vector's first entries (Matryoshka) and
renormalises them when the model normalises, as sentence-transformers' truncate_dim does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog
import torch
import torch.nn.functional as F

from pipeline.config import EngineConfig
from pipeline.intake.embedding_input import EmbeddingInput
from pipeline.loading.model_source import resolve_model
from pipeline.loading.pooling_config import PoolingConfig, read_pooling_config
from pipeline.loading.tokenizer import load_served_tokenizer
from pipeline.model.decoder_pooling import DecoderPooling
from pipeline.model.encoder_runner import EncoderRunner
from pipeline.model.loader import read_config, resolve_device, resolve_dtype
from pipeline.model.models import is_encoder
from pipeline.model.runner import ModelRunner
from pipeline.output.output_processor import OutputProcessor

log = structlog.get_logger(__name__)


def wants_pooling(config: EngineConfig, model_dir: str | Path) -> bool:
    """--runner pooling, or --runner auto with a model that has no language-model head: an encoder
    family or a decoder's base model (Qwen3Model, MistralModel), as vLLM's auto runner decides."""
    architecture = read_config(model_dir)["architectures"][0]
    headless = is_encoder(architecture) or architecture.endswith("Model")
    if headless and config.model.runner == "generate":
        raise ValueError(f"{architecture} has no language-model head: it serves embeddings only (--runner pooling)")
    return config.model.runner == "pooling" or (headless and config.model.runner == "auto")


def _check_supported(config: EngineConfig) -> None:
    """What the pooling runner does not do yet, refused at start rather than on every request."""
    unsupported = {"--tensor-parallel-size > 1": config.model.tensor_parallel_size > 1,
                   "LoRA adapters": config.lora is not None, "speculative decoding": config.speculative is not None}
    named = [name for name, given in unsupported.items() if given]
    if named:
        raise ValueError(f"--runner pooling does not support {', '.join(named)} yet")


@dataclass(slots=True)
class EmbeddingJob:
    prompt_token_ids: list[int]
    dimensions: int | None = None


class EmbeddingEngine:
    pooling = True  # what the gateway and the worker graph ask of an engine

    def __init__(self, config: EngineConfig) -> None:
        _check_supported(config)
        self.config = config
        resolved = resolve_model(config.model.model, resolve_dtype(config.model.dtype,
                                                                   resolve_device(config.model.device)))
        self.model_dir, self.model_name = resolved.path, resolved.name
        encoder = is_encoder(read_config(self.model_dir)["architectures"][0])
        self.pooling_config: PoolingConfig = read_pooling_config(self.model_dir, encoder, config.model.pooling_type,
                                                                 config.model.normalize)
        sched = config.scheduler
        self.runner: EncoderRunner | DecoderPooling
        if encoder:
            self.runner = EncoderRunner(config.model, self.model_dir, self.pooling_config, sched.max_num_batched_tokens)
        else:
            decoder = ModelRunner(config.model, config.cache, sched, str(self.model_dir))
            self.runner = DecoderPooling(decoder, self.pooling_config, sched.max_num_batched_tokens, sched.max_num_seqs)
        self.tokenizer = load_served_tokenizer(self.model_dir, config.model.tokenizer, config.model.chat_template)
        self.max_model_len = self.runner.max_model_len
        self.hidden_size = self.runner.hidden_size
        self.inputs = EmbeddingInput(self.tokenizer, self.runner.vocab_size, self.max_model_len, self.hidden_size,
                                     config.limits.max_prompt_chars_per_token)
        self.outputs = OutputProcessor(self.tokenizer)  # the worker's Output actor keeps routes in it
        self.lora_registry = None
        self.lora_slots = None
        log.info("embedding engine ready", model=str(self.model_dir), encoder=encoder,
                 pooling=self.pooling_config.pooling_type, normalize=self.pooling_config.normalize,
                 hidden_size=self.hidden_size, max_model_len=self.max_model_len)

    def job(self, prompt: str | None, prompt_token_ids: list[int] | None, dimensions: int | None) -> EmbeddingJob:
        """A checked request; ValueError naming the field and the rule."""
        self.inputs.check_dimensions(dimensions)
        return EmbeddingJob(self.inputs.prompt_ids(prompt, prompt_token_ids), dimensions)

    def embed(self, jobs: list[EmbeddingJob]) -> list[np.ndarray]:
        """One float32 vector per job, in order."""
        vectors = self.runner.embed([job.prompt_token_ids for job in jobs])
        return [self._truncate(vector, job.dimensions).numpy().astype(np.float32)
                for vector, job in zip(vectors, jobs, strict=True)]

    def _truncate(self, vector: torch.Tensor, dimensions: int | None) -> torch.Tensor:
        if dimensions is None or dimensions >= vector.shape[0]:
            return vector
        vector = vector[:dimensions]
        return F.normalize(vector, p=2, dim=-1) if self.pooling_config.normalize else vector
