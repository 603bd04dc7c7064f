"""DraftModelProposer: a smaller model with the target's vocabulary drafts tokens greedily.

It runs in the target's process on its own ModelRunner (its own weights and its own small paged KV
cache; no LoRA, no CUDA graphs). Per sequence it remembers the tokens whose keys and values sit in
its cache; a draft call keeps the longest prefix of those that still matches the sequence's tokens
(rejected draft tokens fall off here), computes the rest of the context in one chunk, then decodes
k tokens by argmax, one forward each. Preemption of the target's blocks does not concern it: its
cache stays valid as long as the tokens match. When its pool runs out it evicts the sequence
drafted least recently, which simply recomputes its context at its next draft.

Greedy drafting keeps verification exact: the draft is a deterministic function of the context,
so accepting while the target's own sample equals the draft token emits exactly the tokens plain
decoding draws, greedy or sampled (docs/speculative.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import structlog
import torch

from pipeline.config import CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig
from pipeline.loading.model_source import PACKAGED_MODELS, resolve_model
from pipeline.model.loader import language_config, read_config, resolve_device, resolve_dtype
from pipeline.model.runner import ModelRunner
from pipeline.step.inputs import StepInputs

log = structlog.get_logger(__name__)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True)
class DraftState:
    token_ids: list[int] = field(default_factory=list)  # tokens whose KV is in the draft cache, in order
    block_ids: list[int] = field(default_factory=list)


class DraftModelProposer:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.block_size = runner.block_size
        self.free_blocks = list(range(runner.num_kv_blocks))
        self.states: OrderedDict[int, DraftState] = OrderedDict()  # seq_id -> state, least recently drafted first

    @classmethod
    def load(cls, spec: SpeculativeConfig, model: ModelConfig, cache: CacheConfig, scheduler: SchedulerConfig,
             target_vocab_size: int, max_model_len: int, target_num_blocks: int) -> DraftModelProposer:
        """Load `spec.model` beside a target of `target_vocab_size` tokens; ValueError naming
        speculative_config.model when it cannot serve as the target's draft."""
        assert spec.model is not None
        dtype = resolve_dtype(model.dtype, resolve_device(model.device))
        try:
            resolved = resolve_model(spec.model, dtype)
        except ValueError as error:
            raise ValueError(f"speculative_config.model: {error}") from None
        vocab_size = language_config(read_config(str(resolved.path)))["vocab_size"]
        if vocab_size != target_vocab_size:
            raise ValueError(f"speculative_config.model: the draft model's vocabulary has {vocab_size} tokens, "
                             f"the target's {target_vocab_size}; a draft model must share the target's tokenizer "
                             f"and vocabulary")
        # A GGUF draft keeps its quantized weights like the target; a directory draft loads unquantized.
        quantization = model.quantization
        if quantization == "gguf" and Path(spec.model).suffix != ".gguf" and spec.model not in PACKAGED_MODELS:
            quantization = "none"
        draft_model = replace(model, model=spec.model, max_model_len=max_model_len, quantization=quantization,
                              tensor_parallel_size=1)
        # Room for every sequence that may draft at once, at full length, but never more than the
        # target's own pool plus each drafting sequence's draft tail: that much context cannot run.
        num_drafting = min(scheduler.max_num_seqs, spec.disable_by_batch_size or scheduler.max_num_seqs)
        tail = 1 + _cdiv(spec.num_speculative_tokens, cache.block_size)
        num_blocks = min(num_drafting * _cdiv(max_model_len + spec.num_speculative_tokens, cache.block_size),
                         target_num_blocks + num_drafting * tail)
        runner = ModelRunner(draft_model, replace(cache, num_kv_blocks=num_blocks, enable_prefix_caching=False),
                             scheduler, str(resolved.path))
        log.info("draft model ready", model=spec.model, num_kv_blocks=num_blocks, k=spec.num_speculative_tokens)
        return cls(runner)

    def propose(self, seq_id: int, token_ids: Sequence[int], k: int) -> list[int]:
        """k greedy draft tokens after `token_ids`; [] when the draft cache cannot hold them."""
        state = self.states.pop(seq_id, None) or DraftState()
        self.states[seq_id] = state  # now the most recently drafted
        # Keep the cached prefix that still matches, less the last token: its logits give draft 0.
        kept = min(_common_prefix(state.token_ids, token_ids), len(token_ids) - 1)
        del state.token_ids[kept:]
        if not self._reserve(seq_id, state, len(token_ids) + k - 1):
            self.forget(seq_id)
            return []
        draft: list[int] = []
        feed = list(token_ids[kept:])
        with torch.inference_mode():
            for _ in range(k):
                logits = self.runner.execute(self._inputs(state, feed))
                state.token_ids.extend(feed)
                draft.append(int(torch.argmax(logits[-1]).item()))
                feed = draft[-1:]
        return draft

    def forget(self, seq_id: int) -> None:
        state = self.states.pop(seq_id, None)
        if state is not None:
            self.free_blocks.extend(state.block_ids)

    def _reserve(self, seq_id: int, state: DraftState, num_tokens: int) -> bool:
        """Blocks for num_tokens positions, evicting the least recently drafted other sequences."""
        needed = _cdiv(num_tokens, self.block_size) - len(state.block_ids)
        while needed > len(self.free_blocks):
            victim = next((other for other in self.states if other != seq_id), None)
            if victim is None:
                return False
            self.forget(victim)
        for _ in range(max(0, needed)):
            state.block_ids.append(self.free_blocks.pop())
        return True

    def _inputs(self, state: DraftState, feed: list[int]) -> StepInputs:
        """One sequence's chunk of `feed` tokens after the state's cached ones."""
        start, count = len(state.token_ids), len(feed)
        positions = np.arange(start, start + count, dtype=np.int64)
        blocks = np.asarray(state.block_ids, dtype=np.int64)
        slots = blocks[positions // self.block_size] * self.block_size + positions % self.block_size
        return StepInputs(
            input_ids=np.asarray(feed, dtype=np.int64), positions=positions, slot_mapping=slots,
            query_start_loc=np.array([0, count], dtype=np.int32), seq_lens=np.array([start + count], dtype=np.int32),
            block_tables=blocks.astype(np.int32)[None, :], logits_indices=np.array([count - 1], dtype=np.int64),
            num_tokens=count, max_query_len=count, max_seq_len=start + count)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    length = min(len(a), len(b))
    if length == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:length]) != np.asarray(b[:length]))
    return int(differ[0]) if len(differ) else length
