"""LLMEngine: the synchronous step loop that joins scheduler, tensor prep, model, sampler, output.

The actors of DESIGN §2 run the same stages split across tasks; this class is the embedded,
single-threaded composition used by `aqueduct batch` and `aqueduct bench`, and by tests.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog
import torch

from pipeline.config import EngineConfig
from pipeline.kv_cache_manager import KVCacheManager
from pipeline.model.runner import ModelRunner
from pipeline.output_processor import OutputProcessor
from pipeline.outputs import RequestDelta, TokenLogprob
from pipeline.request import FinishReason, Request, Sequence
from pipeline.rng import request_seed
from pipeline.sampler import Sampler, compute_prompt_logprobs
from pipeline.sampling_batch import SamplerOutput
from pipeline.sampling_params import SamplingParams
from pipeline.scheduler import Scheduler
from pipeline.tensor_prep import PreparedStep, TensorPrep
from pipeline.tokenizer import load_tokenizer

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class EngineStats:
    num_steps: int = 0
    step_seconds: float = 0.0
    forward_seconds: float = 0.0  # inside the model runner (forward + logits)
    sample_seconds: float = 0.0
    num_generated_tokens: int = 0


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        model_dir = config.model.model
        if model_dir is None:
            from pipeline.default_model import default_model_dir
            model_dir = str(default_model_dir())
        self.model_dir = Path(model_dir)
        self.runner = ModelRunner(config.model, config.cache, config.scheduler, str(self.model_dir))
        self.tokenizer = load_tokenizer(self.model_dir)
        self.vocab_size = self.runner.vocab_size
        self.eos_token_ids = frozenset(self.runner.eos_token_ids)
        kv_cache = KVCacheManager(self.runner.num_kv_blocks, config.cache.block_size,
                                  config.cache.enable_prefix_caching)
        self.scheduler = Scheduler(config.scheduler, kv_cache, self.runner.max_model_len)
        self.max_model_len = self.scheduler.max_model_len
        self.tensor_prep = TensorPrep(config.scheduler.max_num_seqs, self.max_model_len, config.cache.block_size)
        self.sampler = Sampler(self.vocab_size)
        self.outputs = OutputProcessor(self.tokenizer)
        self.stats = EngineStats()
        self._arrivals = itertools.count()
        log.info("engine ready", model=str(self.model_dir), num_kv_blocks=self.runner.num_kv_blocks,
                 block_size=config.cache.block_size, max_model_len=self.max_model_len)

    # ---- requests ------------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | Seq[int], params: SamplingParams) -> Request:
        """Validate and queue a request. Bad input raises ValueError naming the problem."""
        if request_id in self.scheduler.requests:
            raise ValueError(f"request id {request_id!r} is already running")
        prompt_text, prompt_ids = self._tokenize(prompt)
        request = Request(
            request_id=request_id,
            prompt_token_ids=prompt_ids,
            params=params,
            seed=request_seed(params.seed, request_id),
            eos_token_ids=self.eos_token_ids,
            prompt=prompt_text,
            arrival_index=next(self._arrivals),
        )
        self.scheduler.add_request(request)
        self.outputs.add_request(request)
        return request

    def abort_request(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> RequestDelta | None:
        request = self.scheduler.abort_request(request_id, reason)
        return self.outputs.collect(request) if request is not None else None

    def _tokenize(self, prompt: str | Seq[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: send prompt_token_ids instead of text")
            if not prompt:
                raise ValueError("prompt must not be empty")
            return prompt, list(self.tokenizer.encode(prompt))
        ids = list(prompt)
        if not ids:
            raise ValueError("prompt_token_ids must not be empty")
        for token_id in ids:
            if not isinstance(token_id, int | np.integer) or isinstance(token_id, bool) \
                    or not 0 <= token_id < self.vocab_size:
                raise ValueError(f"prompt_token_ids must be ints in [0, {self.vocab_size}), got {token_id!r}")
        return None, [int(t) for t in ids]

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    # ---- one step ------------------------------------------------------------------------------

    def step(self) -> list[RequestDelta]:
        started = time.perf_counter()
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return []
        sequences = {seq_id: self.scheduler.sequences[seq_id] for seq_id in plan.num_scheduled_tokens}
        prepared = self.tensor_prep.prepare(plan)
        forward_started = time.perf_counter()
        logits = self.runner.execute(prepared.inputs)
        sample_started = time.perf_counter()
        num_sample_rows = len(prepared.sample_seq_ids)
        sampled = self.sampler(logits[:num_sample_rows], prepared.sampling)
        self.stats.forward_seconds += sample_started - forward_started
        self.stats.sample_seconds += time.perf_counter() - sample_started
        touched: dict[str, Request] = {}
        self._record_prompt_logprobs(prepared, logits[num_sample_rows:], sequences)
        self._record_samples(prepared, sampled, sequences, touched)
        deltas = [self.outputs.collect(request) for request in touched.values()]
        self.stats.num_steps += 1
        self.stats.num_generated_tokens += num_sample_rows
        self.stats.step_seconds += time.perf_counter() - started
        return deltas

    def _record_samples(self, prepared: PreparedStep, sampled: SamplerOutput,
                        sequences: dict[int, Sequence], touched: dict[str, Request]) -> None:
        token_ids = sampled.token_ids.tolist()
        for row, (seq_id, token_id) in enumerate(zip(prepared.sample_seq_ids, token_ids, strict=True)):
            seq = sequences[seq_id]
            if seq.is_finished:
                continue
            self.scheduler.append_token(seq, token_id)
            logprob = _token_logprob(sampled, row, seq.params.logprobs)
            stop_string = self.outputs.on_token(seq, token_id, logprob)
            if stop_string is not None:
                self.scheduler.finish_sequence(seq, FinishReason.STOP, stop_string)
                seq.finish_reason, seq.stop_reason = FinishReason.STOP, stop_string
            touched[seq.request.request_id] = seq.request

    def _record_prompt_logprobs(self, prepared: PreparedStep, logits: torch.Tensor,
                                sequences: dict[int, Sequence]) -> None:
        if not prepared.prompt_logprob_segments:
            return
        max_k = max(sequences[s.seq_id].params.prompt_logprobs for s in prepared.prompt_logprob_segments)
        chosen, ranks, top_ids, top_lps = compute_prompt_logprobs(logits, prepared.prompt_logprob_targets, max_k)
        for segment in prepared.prompt_logprob_segments:
            seq = sequences[segment.seq_id]
            if seq.choice_index != 0:
                continue  # every choice computes the same prompt; report it once
            k = seq.params.prompt_logprobs
            rows = range(segment.row_start, segment.row_start + segment.count)
            entries = [
                TokenLogprob(int(prepared.prompt_logprob_targets[r]), float(chosen[r]), int(ranks[r]),
                             list(zip(top_ids[r, :k].tolist(), top_lps[r, :k].tolist(), strict=True)))
                for r in rows
            ]
            # The request shows up in this step's deltas when its last prompt chunk samples.
            self.outputs.on_prompt_logprobs(seq.request.request_id, entries)


def _token_logprob(sampled: SamplerOutput, row: int, num_logprobs: int | None) -> TokenLogprob | None:
    if num_logprobs is None or sampled.chosen_logprobs is None:
        return None
    top: list[tuple[int, float]] = []
    if num_logprobs and sampled.top_token_ids is not None:
        top = list(zip(sampled.top_token_ids[row, :num_logprobs].tolist(),
                       sampled.top_logprobs[row, :num_logprobs].tolist(), strict=True))
    return TokenLogprob(int(sampled.token_ids[row]), float(sampled.chosen_logprobs[row]),
                        int(sampled.chosen_ranks[row]), top)
