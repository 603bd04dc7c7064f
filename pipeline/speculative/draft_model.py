"""DraftModelProposer: a smaller model with the target's vocabulary drafts tokens greedily.

It runs in the target's process on its own ModelRunner (its own weights and its own small paged KV
cache; no LoRA, no CUDA graphs). Per sequence it remembers the tokens whose keys and values sit in
its cache; a draft call keeps the longest prefix of those that still matches the sequence's tokens
(rejected draft tokens fall off here), computes the rest of the context in one chunk, then decodes
k tokens by argmax, one forward each; the sequences of a step draft together (propose_many: one
forward per draft position for all of them). Preemption of the target's blocks does not concern it: its
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
        if runner.has_recurrent_state:  # it drafts over cached prefixes and truncates them: no state could follow
            runner.close()
            raise ValueError(f"speculative_config.model: {runner.info.architecture} keeps a recurrent state per "
                             "sequence and cannot draft; use a draft model with attention layers only")
        log.info("draft model ready", model=spec.model, num_kv_blocks=num_blocks, k=spec.num_speculative_tokens)
        return cls(runner)

    def propose(self, seq_id: int, token_ids: Sequence[int], k: int) -> list[int]:
        """k greedy draft tokens after `token_ids`; [] when the draft cache cannot hold them."""
        return self.propose_many([(seq_id, token_ids, k)])[seq_id]

    def propose_many(self, requests: list[tuple[int, Sequence[int], int]]) -> dict[int, list[int]]:
        """{seq_id: up to k greedy draft tokens} for each (seq_id, token_ids, k), batched: one forward
        computes every sequence's uncached context, then one forward per draft position decodes all the
        sequences still drafting. [] for a sequence whose draft the cache cannot hold."""
        drafts: dict[int, list[int]] = {seq_id: [] for seq_id, _, _ in requests}
        batch: list[tuple[int, DraftState, list[int], int]] = []  # (seq_id, state, feed, k)
        protected = {seq_id for seq_id, _, _ in requests}
        for seq_id, token_ids, k in requests:
            state = self.states.pop(seq_id, None) or DraftState()
            self.states[seq_id] = state  # now the most recently drafted
            # Keep the cached prefix that still matches, less the last token: its logits give draft 0.
            kept = min(_common_prefix(state.token_ids, token_ids), len(token_ids) - 1)
            del state.token_ids[kept:]
            if k < 1 or not self._reserve(seq_id, state, len(token_ids) + k - 1, protected):
                self.forget(seq_id)
                continue
            batch.append((seq_id, state, list(token_ids[kept:]), k))
        with torch.inference_mode():
            for position in range(max((k for *_, k in batch), default=0)):
                batch = [entry for entry in batch if entry[3] > position]
                logits = self.runner.execute(self._inputs([(state, feed) for _, state, feed, _ in batch]))
                tokens = torch.argmax(logits, dim=-1).tolist()
                for (seq_id, state, feed, _), token in zip(batch, tokens, strict=True):
                    state.token_ids.extend(feed)
                    drafts[seq_id].append(token)
                batch = [(seq_id, state, [token], k)
                         for (seq_id, state, _, k), token in zip(batch, tokens, strict=True)]
        return drafts

    def forget(self, seq_id: int) -> None:
        state = self.states.pop(seq_id, None)
        if state is not None:
            self.free_blocks.extend(state.block_ids)

    def _reserve(self, seq_id: int, state: DraftState, num_tokens: int, protected: set[int]) -> bool:
        """Blocks for num_tokens positions, evicting the least recently drafted sequences outside
        `protected` (the ones drafting in this call)."""
        needed = _cdiv(num_tokens, self.block_size) - len(state.block_ids)
        while needed > len(self.free_blocks):
            victim = next((other for other in self.states if other not in protected), None)
            if victim is None:
                return False
            self.forget(victim)
        for _ in range(max(0, needed)):
            state.block_ids.append(self.free_blocks.pop())
        return True

    def _inputs(self, chunks: list[tuple[DraftState, list[int]]]) -> StepInputs:
        """One forward over each sequence's chunk of `feed` tokens after its cached ones (a prefill
        chunk of any length, or one decode token), logits at each chunk's last token."""
        lengths = np.array([len(feed) for _, feed in chunks], dtype=np.int64)
        starts = np.array([len(state.token_ids) for state, _ in chunks], dtype=np.int64)
        positions = np.concatenate([np.arange(start, start + count)
                                    for start, count in zip(starts, lengths, strict=True)])
        width = max(len(state.block_ids) for state, _ in chunks)
        block_tables = np.zeros((len(chunks), width), dtype=np.int32)
        for row, (state, _) in enumerate(chunks):
            block_tables[row, :len(state.block_ids)] = state.block_ids
        owner = np.repeat(np.arange(len(chunks)), lengths)  # each token's row
        slots = block_tables[owner, positions // self.block_size].astype(np.int64) * self.block_size \
            + positions % self.block_size
        query_start_loc = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        seq_lens = (starts + lengths).astype(np.int32)
        return StepInputs(
            input_ids=np.concatenate([np.asarray(feed, dtype=np.int64) for _, feed in chunks]),
            positions=positions.astype(np.int64), slot_mapping=slots, query_start_loc=query_start_loc,
            seq_lens=seq_lens, block_tables=block_tables, logits_indices=query_start_loc[1:].astype(np.int64) - 1,
            num_tokens=int(lengths.sum()), max_query_len=int(lengths.max()), max_seq_len=int(seq_lens.max()))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    length = min(len(a), len(b))
    if length == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:length]) != np.asarray(b[:length]))
    return int(differ[0]) if len(differ) else length
