"""Sampler: logits -> tokens (+ logprobs), one row per sampled token, vectorized over rows.

Processing order (DESIGN §4, Aphrodite's): bans -> penalties -> top-p, min-p -> top-k ->
temperature. Bans are -inf, so where they happen does not change the result; doing them first
keeps a banned token out of every later statistic. Truncation looks at the temperature-1
distribution, as in Aphrodite (temperature comes last).

Randomness (DESIGN §5): a random row uses exactly one uniform u = rng.uniforms(seed, choice,
position) and takes the first token, in token-id order, whose float64 cumulative probability
exceeds u * total. Every operation is row-wise, so a row's token and logprobs do not depend
on the rest of the batch.

Greedy rows (temperature 0) take the argmax of the processed logits (lowest index on ties,
like torch.argmax). Returned logprobs are log_softmax of the processed logits, with the
temperature applied for random rows and without it for greedy rows.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline import rng
from pipeline.sampling_batch import SamplerOutput, SamplingBatch


def _column(values: np.ndarray, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[R] numpy -> [R, 1] tensor, ready to broadcast against [R, V] logits."""
    return torch.as_tensor(np.ascontiguousarray(values), device=device).to(dtype)[:, None]


def _token_counts(token_lists: list[np.ndarray], vocab_size: int, device: torch.device) -> torch.Tensor:
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


def _needs_penalties(batch: SamplingBatch) -> bool:
    return bool((batch.repetition_penalty != 1).any() or (batch.presence_penalty != 0).any()
                or (batch.frequency_penalty != 0).any())


def _needs_truncation(batch: SamplingBatch, vocab_size: int) -> bool:
    top_k_active = (batch.top_k > 0) & (batch.top_k < vocab_size)
    return bool((batch.top_p < 1).any() or (batch.min_p > 0).any() or top_k_active.any())


def _apply_bans(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    logits = logits.clone()  # never write into the caller's tensor
    rows = torch.from_numpy(np.asarray(batch.banned_rows, dtype=np.int64)).to(logits.device)
    tokens = torch.from_numpy(np.asarray(batch.banned_tokens, dtype=np.int64)).to(logits.device)
    logits[rows, tokens] = float("-inf")
    return logits


def _apply_penalties(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Repetition (HF/vLLM: positive logits divided, negative multiplied) over prompt + output
    tokens, then presence and frequency over output tokens. Neutral rows come out unchanged
    bit for bit (x / 1, x * 1, x - 0), so every row can go through the same arithmetic."""
    if batch.prompt_token_ids is None or batch.output_token_ids is None:
        raise ValueError("SamplingBatch asks for penalties but prompt/output_token_ids are None")
    device, vocab_size = logits.device, logits.shape[1]
    output_counts = _token_counts(batch.output_token_ids, vocab_size, device)
    if (batch.repetition_penalty != 1).any():
        seen = (_token_counts(batch.prompt_token_ids, vocab_size, device) > 0) | (output_counts > 0)
        repetition = _column(batch.repetition_penalty, device, torch.float32)
        penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
        logits = torch.where(seen, penalized, logits)
    if (batch.presence_penalty != 0).any() or (batch.frequency_penalty != 0).any():
        frequency = _column(batch.frequency_penalty, device, torch.float32)
        presence = _column(batch.presence_penalty, device, torch.float32)
        logits = logits - frequency * output_counts - presence * (output_counts > 0).float()
    return logits


def _apply_truncation(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """top-p, then min-p, then top-k, all on the temperature-1 distribution, in one sort.

    Each keeps a prefix of the tokens sorted by probability, and min-p compares ratios to the
    top token, which renormalization does not change; so applying them one after another equals
    intersecting the three prefixes computed on the same distribution. Worked example, sorted
    probs [0.5, 0.3, 0.15, 0.05] with top_p 0.8: mass before each token [0, 0.5, 0.8, 0.95]
    -> keep [T, T, F, F] (the smallest prefix whose mass reaches p).
    """
    device, vocab_size = logits.device, logits.shape[1]
    # Stable sort: equal logits keep token-id order, so ties truncate the same in any batch.
    sorted_logits, sorted_ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    mass_before[:, 0] = 0.0
    top_p = _column(batch.top_p, device, torch.float32)
    keep = (mass_before < top_p) | (top_p >= 1)  # p = 1 must not drop a rounding-error tail
    min_p = _column(batch.min_p, device, torch.float32)
    keep &= sorted_probs >= min_p * sorted_probs[:, :1]
    top_k = _column(batch.top_k, device, torch.int64)
    ranks = torch.arange(vocab_size, device=device)[None, :]
    keep &= (ranks < top_k) | (top_k <= 0)
    remove = torch.zeros_like(keep).scatter_(1, sorted_ids, ~keep)
    return logits.masked_fill(remove, float("-inf"))


def _apply_temperature(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    temperature = np.where(batch.temperature == 0, 1.0, batch.temperature)  # greedy rows: as is
    if (temperature == 1).all():
        return logits
    return logits / _column(temperature, logits.device, torch.float32)


def _sample_inverse_cdf(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """First token whose cumulative probability exceeds u * total, in token-id order.

    Example: probs [0.2, 0.0, 0.5, 0.3], u = 0.6 -> cdf [0.2, 0.2, 0.7, 1.0] -> token 2.
    cdf[i] > cdf[i - 1] at the chosen i, and u > 0, so a zero-probability token is never
    chosen, except when rounding puts u * total at or past the end: then take the last token
    with nonzero probability.
    """
    probs = logits.softmax(dim=-1)
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)
    thresholds = uniforms[:, None] * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, thresholds, right=True).squeeze(1)
    vocab_size = logits.shape[1]
    overflow = tokens >= vocab_size
    if overflow.any():
        last_nonzero = vocab_size - 1 - torch.argmax((probs.flip(-1) > 0).to(torch.int8), dim=-1)
        tokens = torch.where(overflow, last_nonzero, tokens)
    return tokens


def _top_logprobs(
    logprobs: torch.Tensor, token_ids: torch.Tensor, num_alternatives: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chosen logprob, its rank (1 + tokens strictly more likely), and the top alternatives.

    A stable sort rather than torch.topk: topk orders ties (e.g. the -inf of truncated tokens)
    differently for different batch sizes, and a row's output must not depend on its batch.
    """
    chosen = logprobs.gather(1, token_ids[:, None])
    ranks = 1 + (logprobs > chosen).sum(dim=-1)
    if num_alternatives == 0:
        empty = logprobs[:, :0]
        return chosen.squeeze(1), ranks, empty.to(torch.int64), empty
    top_logprobs, top_ids = torch.sort(logprobs, dim=-1, descending=True, stable=True)
    top_logprobs, top_ids = top_logprobs[:, :num_alternatives], top_ids[:, :num_alternatives]
    return chosen.squeeze(1), ranks, top_ids, top_logprobs


def _argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """Per-row argmax, lowest index on ties. On CPU through numpy: torch's CPU argmax took 440 us
    for [128, 4096] float32 here, numpy's 44 us (same ties rule: the first maximal index)."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(logits.numpy().argmax(axis=-1).astype(np.int64, copy=False))
    return torch.argmax(logits, dim=-1)


class Sampler:
    """Turns [R, V] logits and a SamplingBatch into a SamplerOutput (numpy, host memory)."""

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        logits = self._trim(logits)
        if self._is_plain_greedy(batch):
            return SamplerOutput(token_ids=_argmax_rows(logits).cpu().numpy().astype(np.int64))
        processed = self.process_logits(logits, batch)
        token_ids = self._choose_tokens(processed, batch)
        output = SamplerOutput(token_ids=token_ids.cpu().numpy().astype(np.int64))
        if (batch.num_logprobs >= 0).any():
            self._fill_logprobs(output, processed, token_ids, batch)
        return output

    def process_logits(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """bans -> penalties -> truncation -> temperature (random rows); a new float32 tensor."""
        logits = self._trim(logits).float()
        if len(batch.banned_rows) > 0:
            logits = _apply_bans(logits, batch)
        if _needs_penalties(batch):
            logits = _apply_penalties(logits, batch)
        if _needs_truncation(batch, self.vocab_size):
            logits = _apply_truncation(logits, batch)
        return _apply_temperature(logits, batch)

    def _trim(self, logits: torch.Tensor) -> torch.Tensor:
        # lm_heads are often padded past the tokenizer's vocabulary; those ids must never win.
        if logits.ndim != 2 or logits.shape[1] < self.vocab_size:
            raise ValueError(f"logits must be [R, >= {self.vocab_size}], got {tuple(logits.shape)}")
        return logits[:, : self.vocab_size]

    def _is_plain_greedy(self, batch: SamplingBatch) -> bool:
        return bool((batch.temperature == 0).all() and len(batch.banned_rows) == 0
                    and not _needs_penalties(batch) and (batch.num_logprobs < 0).all())

    def _choose_tokens(self, processed: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        device = processed.device
        token_ids = torch.empty(processed.shape[0], dtype=torch.int64, device=device)
        greedy_np = batch.temperature == 0
        greedy_rows = torch.from_numpy(np.flatnonzero(greedy_np)).to(device)
        random_rows_np = np.flatnonzero(~greedy_np)
        random_rows = torch.from_numpy(random_rows_np).to(device)
        if len(greedy_rows) > 0:
            token_ids[greedy_rows] = _argmax_rows(processed[greedy_rows])
        if len(random_rows_np) > 0:
            uniforms_np = rng.uniforms(batch.seeds[random_rows_np], batch.choice_index[random_rows_np],
                                       batch.output_position[random_rows_np])
            uniforms = torch.from_numpy(uniforms_np).to(device)
            token_ids[random_rows] = _sample_inverse_cdf(processed[random_rows], uniforms)
        return token_ids

    def _fill_logprobs(self, output: SamplerOutput, processed: torch.Tensor, token_ids: torch.Tensor,
                       batch: SamplingBatch) -> None:
        num_rows = processed.shape[0]
        num_alternatives = min(int(batch.num_logprobs.max()), self.vocab_size)
        rows_np = np.flatnonzero(batch.num_logprobs >= 0)
        rows = torch.from_numpy(rows_np).to(processed.device)
        logprobs = torch.log_softmax(processed[rows], dim=-1)
        chosen, ranks, top_ids, top_logprobs = _top_logprobs(logprobs, token_ids[rows], num_alternatives)
        # Rows that did not ask keep zeros (the contract allows junk there).
        output.chosen_logprobs = np.zeros(num_rows, dtype=np.float32)
        output.chosen_ranks = np.zeros(num_rows, dtype=np.int64)
        output.top_token_ids = np.zeros((num_rows, num_alternatives), dtype=np.int64)
        output.top_logprobs = np.zeros((num_rows, num_alternatives), dtype=np.float32)
        output.chosen_logprobs[rows_np] = chosen.cpu().numpy()
        output.chosen_ranks[rows_np] = ranks.cpu().numpy()
        output.top_token_ids[rows_np] = top_ids.cpu().numpy()
        output.top_logprobs[rows_np] = top_logprobs.cpu().numpy()


def compute_prompt_logprobs(
    logits: torch.Tensor, target_token_ids: np.ndarray, num_logprobs: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Logprobs of the model's raw distribution (no sampling processors, as vLLM) for prompt
    tokens: row i of `logits` predicts target_token_ids[i].

    Returns (chosen [P] float32, ranks [P] int64, top_ids [P, K] int64, top_logprobs [P, K]
    float32) with K = num_logprobs, best first.
    """
    if num_logprobs < 0:
        raise ValueError(f"num_logprobs must be >= 0, got {num_logprobs}")
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    targets = torch.from_numpy(np.asarray(target_token_ids, dtype=np.int64)).to(logits.device)
    num_alternatives = min(num_logprobs, logits.shape[1])
    chosen, ranks, top_ids, top_logprobs = _top_logprobs(logprobs, targets, num_alternatives)
    return (chosen.cpu().numpy().astype(np.float32), ranks.cpu().numpy().astype(np.int64),
            top_ids.cpu().numpy().astype(np.int64), top_logprobs.cpu().numpy().astype(np.float32))
