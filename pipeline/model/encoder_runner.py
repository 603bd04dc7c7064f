"""EncoderRunner: an encoder family's model (pipeline/model/models/bert.py) for embeddings.

No KV cache and no steps: a batch of prompts is one padded forward ([B, longest] with an attention
mask), pooled per prompt (pooler.py). Prompts are sorted by length into sub-batches of at most
`max_batch_tokens` padded tokens, so one long prompt does not pad many short ones.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import structlog
import torch

from pipeline.config import ModelConfig
from pipeline.host_to_device import to_device
from pipeline.loading.pooling_config import PoolingConfig
from pipeline.model.loader import iter_weights, materialize, read_config, resolve_device, resolve_dtype
from pipeline.model.models import family_of
from pipeline.model.pooler import finish, pool_padded

log = structlog.get_logger(__name__)


class EncoderRunner:
    def __init__(self, model_config: ModelConfig, model_dir: str | Path, pooling: PoolingConfig,
                 max_batch_tokens: int) -> None:
        if model_config.tensor_parallel_size > 1:
            raise ValueError("encoder models run on one rank: --tensor-parallel-size must be 1")
        self.device = resolve_device(model_config.device)
        self.dtype = resolve_dtype(model_config.dtype, self.device)
        config = read_config(model_dir)
        with torch.device("meta"):
            self.model = family_of(config["architectures"][0]).build_encoder(config)
        materialize(self.model, self.dtype, self.device)
        self.model.load_weights(iter_weights(model_dir))
        self.model.eval()
        self.pooling = pooling
        self.max_batch_tokens = max_batch_tokens
        self.hidden_size = self.model.config.hidden_size
        self.vocab_size = self.model.config.vocab_size
        self.max_model_len = min(model_config.max_model_len or self.model.config.max_tokens,
                                 self.model.config.max_tokens)
        log.info("encoder loaded", architecture=config["architectures"][0], device=str(self.device),
                 dtype=str(self.dtype), max_model_len=self.max_model_len)

    def embed(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        """One float32 vector [hidden_size] per prompt, in order."""
        order = sorted(range(len(prompts)), key=lambda index: len(prompts[index]))
        vectors: dict[int, torch.Tensor] = {}
        for batch in self._batches(order, prompts):
            for index, vector in zip(batch, self._forward([prompts[i] for i in batch]), strict=True):
                vectors[index] = vector
        return [vectors[index] for index in range(len(prompts))]

    def _batches(self, order: list[int], prompts: list[list[int]]) -> list[list[int]]:
        """Sorted by length, cut where the padded size would pass max_batch_tokens."""
        batches: list[list[int]] = []
        for index in order:
            if batches and len(prompts[index]) * (len(batches[-1]) + 1) <= self.max_batch_tokens:
                batches[-1].append(index)
            else:
                batches.append([index])
        return batches

    def _forward(self, prompts: list[list[int]]) -> torch.Tensor:
        longest = max(len(prompt) for prompt in prompts)
        ids_np = np.zeros((len(prompts), longest), dtype=np.int64)
        for row, prompt in enumerate(prompts):
            ids_np[row, :len(prompt)] = prompt
        lengths_np = np.array([len(prompt) for prompt in prompts], dtype=np.int64)
        ids, lengths = to_device(ids_np, self.device), to_device(lengths_np, self.device)
        mask = torch.arange(longest, device=self.device)[None, :] < lengths[:, None]
        with torch.inference_mode():
            hidden = self.model(ids, mask)
            return finish(pool_padded(hidden, lengths, self.pooling.pooling_type), self.pooling).cpu()
