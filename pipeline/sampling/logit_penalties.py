"""Stages 1-2 of docs/sampling.md: bans and logit bias, then repetition, frequency and presence penalties."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.sampling.row_ops import column
from pipeline.step.sampling_batch import AdvancedColumns, SamplingBatch


def apply_bans(logits: torch.Tensor, banned_rows: np.ndarray, banned_tokens: np.ndarray) -> torch.Tensor:
    """custom_token_bans, and EOS/stop tokens before min_tokens: -inf, in place."""
    rows = torch.from_numpy(np.asarray(banned_rows, dtype=np.int64)).to(logits.device)
    tokens = torch.from_numpy(np.asarray(banned_tokens, dtype=np.int64)).to(logits.device)
    logits[rows, tokens] = float("-inf")
    return logits


def apply_logit_bias(logits: torch.Tensor, advanced: AdvancedColumns) -> torch.Tensor:
    """logit_bias added in place. A row's ids are distinct (a map), so plain indexing adds each once;
    a banned token stays -inf whatever its bias, so bias and bans commute."""
    rows = torch.from_numpy(advanced.bias_rows).to(logits.device)
    tokens = torch.from_numpy(advanced.bias_tokens).to(logits.device)
    logits[rows, tokens] += torch.from_numpy(advanced.bias_values).to(logits.device)
    return logits


def needs_penalties(batch: SamplingBatch) -> bool:
    return bool((batch.repetition_penalty != 1).any() or (batch.presence_penalty != 0).any()
                or (batch.frequency_penalty != 0).any())


def token_counts(token_lists: list[np.ndarray], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[R, V] float32 occurrence counts of each token id per row.

    Rows are padded with the id `vocab_size`, which lands in an extra bin that is dropped:
        lists [[3, 3], [1]], V = 4 -> padded [[3, 3], [1, 4]] -> counts [[0, 0, 0, 2], [0, 1, 0, 0]]
    """
    lengths = np.fromiter((len(ids) for ids in token_lists), dtype=np.int64, count=len(token_lists))
    max_length = int(lengths.max(initial=0))
    padded = np.full((len(token_lists), max_length), vocab_size, dtype=np.int64)
    if max_length > 0:
        # Row-major boolean assignment fills each row's prefix with its ids, in order.
        padded[np.arange(max_length)[None, :] < lengths[:, None]] = np.concatenate(token_lists)
    padded_gpu = torch.from_numpy(padded).to(device)
    counts = torch.zeros(len(token_lists), vocab_size + 1, dtype=torch.float32, device=device)
    counts.scatter_add_(1, padded_gpu, torch.ones_like(padded_gpu, dtype=torch.float32))
    return counts[:, :vocab_size]


def apply_penalties(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Repetition (HF/vLLM: positive logits divided, negative multiplied) over prompt + output
    tokens, then presence and frequency over output tokens. Neutral rows come out unchanged
    bit for bit (x / 1, x * 1, x - 0), so every row can go through the same arithmetic."""
    if batch.prompt_token_ids is None or batch.output_token_ids is None:
        raise ValueError("SamplingBatch asks for penalties but prompt/output_token_ids are None")
    device, vocab_size = logits.device, logits.shape[1]
    output_counts = token_counts(batch.output_token_ids, vocab_size, device)
    windowed = batch.advanced is not None and bool((batch.advanced.repetition_penalty_range > 0).any())
    if windowed:
        logits = _windowed_repetition(logits, batch)
    elif (batch.repetition_penalty != 1).any():
        seen = (token_counts(batch.prompt_token_ids, vocab_size, device) > 0) | (output_counts > 0)
        repetition = column(batch.repetition_penalty, device, torch.float32)
        penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
        logits = torch.where(seen, penalized, logits)
    if (batch.presence_penalty != 0).any() or (batch.frequency_penalty != 0).any():
        frequency = column(batch.frequency_penalty, device, torch.float32)
        presence = column(batch.presence_penalty, device, torch.float32)
        logits = logits - frequency * output_counts - presence * (output_counts > 0).float()
    return logits


def _windowed_repetition(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Repetition penalty where some row has a window (KoboldAI's rep_pen_range / rep_pen_slope).

    A row's window is the last `range` tokens of prompt + output (0: all, and no slope). Its newer
    half takes the full penalty r, a token seen only in its older half 1 + (r - 1) * slope (r > 1).
    Worked example: prompt + output [4, 7, 4, 9, 2], range 4 -> window [7, 4, 9, 2]; older half
    [7, 4], newer [9, 2]: tokens 9 and 2 get r, 7 and 4 the reduced penalty (4 was seen earlier
    too, outside the window, which does not count)."""
    assert batch.advanced is not None and batch.prompt_token_ids is not None and batch.output_token_ids is not None
    device, vocab_size = logits.device, logits.shape[1]
    newer, older = [], []
    for prompt, output, window in zip(batch.prompt_token_ids, batch.output_token_ids,
                                      batch.advanced.repetition_penalty_range, strict=True):
        context = np.concatenate([prompt, output])
        if window > 0:
            context = context[-int(window):]
        split = (len(context) + 1) // 2 if window > 0 else 0  # the older half rounds up
        older.append(context[:split])
        newer.append(context[split:])
    seen_newer = token_counts(newer, vocab_size, device) > 0
    seen_older = token_counts(older, vocab_size, device) > 0
    repetition = column(batch.repetition_penalty, device, torch.float32)
    slope = column(batch.advanced.repetition_penalty_slope, device, torch.float32)
    reduced = torch.where(repetition > 1, 1 + (repetition - 1) * slope, repetition)
    factor = torch.where(seen_newer, repetition, torch.where(seen_older, reduced, torch.ones_like(repetition)))
    penalized = torch.where(logits > 0, logits / factor, logits * factor)
    return torch.where(seen_newer | seen_older, penalized, logits)
