"""Checks the model-family tests share beside window_checks.py: a model loaded alone (no runner) to
inspect or refuse, prefill-then-decode steps in a lower precision against HF's own, and the logits a
model gives with one of its distinctive parts switched off."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.model.attention.paged import TorchPagedAttention
from pipeline.model.loader import attention_shape, load_model, read_config
from pipeline.model.runner import ModelRunner
from tests.pipeline.model.test_model_forward import Reference, Seqs


def load_float32(path: Path) -> torch.nn.Module:
    """The checkpoint's model in float32 on the CPU, over a paged backend of block size 16."""
    shape = attention_shape(read_config(path))
    backend = TorchPagedAttention(shape.num_heads, shape.num_kv_heads, shape.head_dim, 16, scale=shape.scale,
                                  windows=shape.windows)
    model, _ = load_model(path, backend, dtype=torch.float32, device=torch.device("cpu"), max_positions=64)
    return model


def check_prefills_then_decodes(runner: ModelRunner, reference: Reference, seqs: Seqs, lengths: tuple[int, ...],
                                num_steps: int, atol: float) -> None:
    """Prompts of `lengths` prefilled in one step, then decodes of all, `num_steps` steps in all, each step's
    logits within `atol` of the reference's (a bfloat16 runner against HF in bfloat16)."""
    chunks = [(seqs.add(n), n) for n in lengths]
    for _ in range(num_steps):
        logits = runner.execute(seqs.step(chunks))
        torch.testing.assert_close(logits, seqs.expected(reference, chunks), atol=atol, rtol=0)
        for seq, _ in chunks:
            seqs.append_token(seq)
        chunks = [(seq, 1) for seq, _ in chunks]


def prefill_logits_and_expected(runner: ModelRunner, reference: Reference) -> tuple[torch.Tensor, torch.Tensor]:
    """The runner's logits for prompts of 18, 45 and 70 tokens in one step, and HF's for them: with a part
    switched off, the test asserts how far apart they are."""
    seqs = Seqs(runner.block_size, seed=3)
    chunks = [(seqs.add(n), n) for n in (18, 45, 70)]
    logits = runner.execute(seqs.step(chunks))
    return logits, seqs.expected(reference, chunks)
