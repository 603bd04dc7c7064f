"""BERT-style encoders (BertModel, XLMRobertaModel): the pooling runner's family for embeddings.

Absolute position embeddings, token type embeddings (all type 0: one text per input), post-LayerNorm
blocks, GELU MLP and bidirectional attention. No KV cache: an encoder sees the whole prompt at once,
so it runs as one padded forward per batch ([B, T] with an attention mask), never in decode steps.
XLM-R counts positions from `pad_token_id + 1`, as HF's create_position_ids_from_input_ids does.
Module names mirror HF checkpoints; a task model's prefix (`bert.`, `roberta.`) is taken off and its
heads (`pooler.`, `cls.`, `lm_head.`) are not loaded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ENCODER = True  # the pooling runner's whole-prompt path (pipeline/model/encoder_runner.py)
_ROBERTA_TYPES = ("roberta", "xlm-roberta")
_PREFIXES = ("bert.", "roberta.", "model.")
_HEADS = ("pooler.", "cls.", "lm_head.", "classifier.")
_ACTIVATIONS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}


@dataclass(frozen=True, slots=True)
class EncoderConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float
    position_offset: int  # XLM-R: pad_token_id + 1; BERT: 0
    gelu_approximate: str

    @property
    def max_tokens(self) -> int:
        """The longest input the position table covers."""
        return self.max_positions - self.position_offset


def encoder_config(config: dict[str, Any]) -> EncoderConfig:
    activation = config.get("hidden_act", "gelu")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"hidden_act {activation!r} is not supported for encoders; "
                         f"supported: {', '.join(_ACTIVATIONS)}")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"position_embedding_type {config['position_embedding_type']!r} is not supported; "
                         "only absolute")
    roberta = config.get("model_type") in _ROBERTA_TYPES
    return EncoderConfig(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"], num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"], max_positions=config["max_position_embeddings"],
        type_vocab_size=config.get("type_vocab_size", 2), layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
        position_offset=int(config.get("pad_token_id", 1)) + 1 if roberta else 0,
        gelu_approximate=_ACTIVATIONS[activation])


class Embeddings(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_positions, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.position_offset = config.position_offset

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device) + self.position_offset
        hidden = self.word_embeddings(input_ids) + self.position_embeddings(positions)[None]
        return self.LayerNorm(hidden + self.token_type_embeddings.weight[0])


class SelfAttention(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        batch, length, width = hidden.shape

        def heads(projection: nn.Linear) -> torch.Tensor:  # [B, T, H*D] -> [B, H, T, D]
            return projection(hidden).view(batch, length, self.num_heads, -1).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.query), heads(self.key), heads(self.value),
                                             attn_mask=key_mask[:, None, None, :])
        return out.transpose(1, 2).reshape(batch, length, width)


class DenseNorm(nn.Module):
    """HF's BertSelfOutput / BertOutput: LayerNorm(dense(x) + residual)."""

    def __init__(self, in_features: int, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(hidden) + residual)


class Attention(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.self = SelfAttention(config)
        self.output = DenseNorm(config.hidden_size, config)


class Intermediate(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.approximate = config.gelu_approximate

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(hidden), approximate=self.approximate)


class Layer(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.attention = Attention(config)
        self.intermediate = Intermediate(config)
        self.output = DenseNorm(config.intermediate_size, config)

    def forward(self, hidden: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.attention.output(self.attention.self(hidden, key_mask), hidden)
        return self.output(self.intermediate(hidden), hidden)


class Encoder(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(config) for _ in range(config.num_layers))


class BertModel(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids [B, T], attention_mask [B, T] bool (False: padding) -> hidden states [B, T, hidden]."""
        hidden = self.embeddings(input_ids)
        for layer in self.encoder.layer:
            hidden = layer(hidden, attention_mask)
        return hidden

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors in; raise if one is unexpected, misshapen or missing."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for raw_name, tensor in weights:
            name = _local_name(raw_name)
            if name is None:
                continue
            if name not in params:
                raise ValueError(f"unexpected weight in checkpoint: {raw_name}")
            if params[name].shape != tensor.shape:
                raise ValueError(f"weight {raw_name} has shape {tuple(tensor.shape)}, "
                                 f"expected {tuple(params[name].shape)}")
            with torch.no_grad():
                params[name].copy_(tensor)
            loaded.add(name)
        missing = sorted(set(params) - loaded)
        if missing:
            raise ValueError(f"checkpoint is missing weights: {missing[:8]}")


def _local_name(name: str) -> str | None:
    """A checkpoint name as this module names it; None for what an embedder does not use."""
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    if name.startswith(_HEADS) or name.endswith("position_ids"):
        return None
    return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


def build_encoder(config: dict[str, Any]) -> BertModel:
    return BertModel(encoder_config(config))
