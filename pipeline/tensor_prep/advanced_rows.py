"""AdvancedRows: the persistent batch's columns for Aphrodite's samplers (AdvancedColumns per step).

Kept apart from the classic columns so that a step in which no row uses any of these samplers
costs one `any()` here and nothing in the sampler.
"""

from __future__ import annotations

import numpy as np

from pipeline.step.sampling_batch import AdvancedColumns
from pipeline.tensor_prep.sampling_rows import NEUTRAL_ADVANCED, AdvancedRowValues

_EMPTY = np.zeros(0, np.int64)
_RAGGED = ("dry_sequence_breakers", "logit_bias", "dry_range")
_DTYPES = {"mirostat": np.bool_, "mirostat_tau": np.float64, "mirostat_eta": np.float64, "dry_base": np.float64,
           "dry_allowed_length": np.int64, "repetition_penalty_range": np.int64}
_NUMERIC = tuple(name for name in AdvancedRowValues._fields if name not in _RAGGED)


class AdvancedRows:
    def __init__(self, max_num_seqs: int) -> None:
        self.used = np.zeros(max_num_seqs, np.bool_)
        self.columns = {name: np.full(max_num_seqs, getattr(NEUTRAL_ADVANCED, name), _DTYPES.get(name, np.float32))
                        for name in _NUMERIC}
        self.mirostat_mu = np.zeros(max_num_seqs, np.float64)
        self.dry_range = np.zeros(max_num_seqs, np.int64)
        self.dry_sequence_breakers: list[tuple[str, ...]] = [()] * max_num_seqs
        self.logit_bias: list[tuple[tuple[int, float], ...]] = [()] * max_num_seqs

    def set(self, row: int, values: AdvancedRowValues | None, mirostat_mu: float | None) -> None:
        """A (re)scheduled sequence's values; mu None = a new choice, which starts at 2 tau."""
        self.used[row] = values is not None
        values = values or NEUTRAL_ADVANCED
        for name in _NUMERIC:
            self.columns[name][row] = getattr(values, name)
        self.dry_range[row] = values.dry_range
        self.dry_sequence_breakers[row] = values.dry_sequence_breakers
        self.logit_bias[row] = values.logit_bias
        self.mirostat_mu[row] = 2 * values.mirostat_tau if mirostat_mu is None else mirostat_mu

    def set_mirostat_mu(self, row: int, mirostat_mu: float | None) -> None:
        if mirostat_mu is not None:
            self.mirostat_mu[row] = mirostat_mu

    def batch_columns(self, rows: np.ndarray, token_ids: np.ndarray, contexts: np.ndarray) -> AdvancedColumns | None:
        """Columns for sampling rows `rows`; None when none of them uses these samplers.
        `token_ids` is the persistent batch's (prompt + output per row); `contexts[i]` how many of
        row rows[i]'s tokens sampling row i sees."""
        if not self.used[rows].any():
            return None
        bias_rows, bias_tokens, bias_values = self._bias_triples(rows)
        return AdvancedColumns(
            **{name: self.columns[name][rows] for name in _NUMERIC},
            mirostat_mu=self.mirostat_mu[rows],
            dry_sequence_breakers=[self.dry_sequence_breakers[row] for row in rows],
            dry_context=self._dry_contexts(rows, token_ids, contexts),
            bias_rows=bias_rows, bias_tokens=bias_tokens, bias_values=bias_values,
        )

    def _dry_contexts(self, rows: np.ndarray, token_ids: np.ndarray, visible: np.ndarray) -> list[np.ndarray]:
        contexts = []
        for row, num_tokens in zip(rows, visible, strict=True):
            if self.columns["dry_multiplier"][row] <= 0:
                contexts.append(_EMPTY)
                continue
            end = int(num_tokens)
            start = max(end - int(self.dry_range[row]), 0) if self.dry_range[row] > 0 else 0
            contexts.append(token_ids[row, start:end].astype(np.int64))
        return contexts

    def _bias_triples(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """[(5, 2.0)] on batch row 1, [(3, -1.0), (9, 0.5)] on batch row 2 ->
        rows [1, 2, 2], tokens [5, 3, 9], values [2.0, -1.0, 0.5]."""
        biases = [self.logit_bias[row] for row in rows]
        counts = [len(bias) for bias in biases]
        if sum(counts) == 0:
            return _EMPTY, _EMPTY, np.zeros(0, np.float32)
        pairs = np.array([pair for bias in biases for pair in bias], np.float64)
        batch_rows = np.repeat(np.arange(len(rows)), counts).astype(np.int64)
        return batch_rows, pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.float32)
