"""LLMEngine: the synchronous step loop that joins scheduler, tensor prep, model, sampler, output.

It also owns the pipeline objects (runner, scheduler, tensor prep, sampler, request builder,
output processor) that a worker's actors run as separate stages (actors/worker/run.py). `step()` is
the same stages in one thread: `aqueduct bench`, tests and offline use go through it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import structlog

from pipeline.config import EngineConfig, ModelConfig
from pipeline.grammar.compiler import GrammarCompiler
from pipeline.intake.chat_content import ChatContentGuard
from pipeline.intake.image_processor import ImageLimits, ImageProcessor
from pipeline.intake.request_builder import RequestBuilder
from pipeline.loading.generation_config import load_generation_defaults
from pipeline.loading.model_source import resolve_model
from pipeline.loading.tokenizer import load_served_tokenizer
from pipeline.lora.slots import LoRASlots
from pipeline.model.loader import resolve_device, resolve_dtype
from pipeline.model.runner import ModelRunner
from pipeline.output.output_processor import OutputProcessor
from pipeline.request.generation_defaults import GenerationDefaults
from pipeline.request.outputs import RequestDelta
from pipeline.request.request import FinishReason, Request
from pipeline.request.sampling_params import SamplingParams
from pipeline.sampling.dry import SequenceBreakers, token_decoder
from pipeline.sampling.sampler import Sampler
from pipeline.sampling.step_sampling import sample_step
from pipeline.scheduling.adapter_gate import AdapterGate
from pipeline.scheduling.kv_cache_manager import KVCacheManager
from pipeline.scheduling.lookahead import PLAN_AHEAD_MAX_TOKENS
from pipeline.scheduling.scheduler import Scheduler, SchedulerFeatures
from pipeline.speculative.draft_model import DraftModelProposer
from pipeline.speculative.speculator import Speculator
from pipeline.tensor_prep.prepare import TensorPrep

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class EngineStats:
    num_steps: int = 0
    step_seconds: float = 0.0
    forward_seconds: float = 0.0  # inside the model runner (forward + logits)
    sample_seconds: float = 0.0
    num_draft_tokens: int = 0  # speculative decoding: tokens drafted and verified
    num_accepted_tokens: int = 0  # of those, accepted


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        # The runner resolves the same dtype; a GGUF file is converted to it (pipeline/loading/model_source.py).
        dtype = resolve_dtype(config.model.dtype, resolve_device(config.model.device))
        resolved = resolve_model(config.model.model, dtype)
        self.model_dir, self.model_name = resolved.path, resolved.name
        self.runner = ModelRunner(config.model, config.cache, config.scheduler, str(self.model_dir), config.lora,
                                  exact_rows=config.model.batch_invariant or config.speculative is not None)
        self._check_recurrent_state(config)
        self.lora_registry = self.runner.lora_registry
        self.lora_slots = LoRASlots(config.lora.max_loras) if config.lora is not None else None
        if config.lora is not None and self.lora_registry is not None:
            for name, path in config.lora.modules:
                self.lora_registry.load(name, path)
        self.tokenizer = load_served_tokenizer(self.model_dir, config.model.tokenizer, config.model.chat_template)
        self.vocab_size = self.runner.vocab_size
        self.eos_token_ids = frozenset(self.runner.eos_token_ids)
        # A cached prefix would need the recurrent state at its end, which is not kept (docs/design.md §4).
        kv_cache = KVCacheManager(self.runner.num_kv_blocks, config.cache.block_size,
                                  config.cache.enable_prefix_caching and not self.runner.has_recurrent_state,
                                  sliding_window=self.runner.info.attention.kv_window)
        self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids) \
            if self.tokenizer is not None else None
        self.draft_model = self._draft_model(config)
        self.scheduler = Scheduler(config.scheduler, kv_cache, self.runner.max_model_len, self._features(config))
        if self.runner.device.type == "cpu":
            self.scheduler.plan_ahead_max_tokens = PLAN_AHEAD_MAX_TOKENS
        self.max_model_len = self.scheduler.max_model_len
        self.tensor_prep = TensorPrep(config.scheduler.max_num_seqs, self.max_model_len, config.cache.block_size)
        breakers = SequenceBreakers(token_decoder(self.tokenizer), self.vocab_size)
        self.sampler = Sampler(self.vocab_size, logprobs_mode=config.model.logprobs_mode, breakers=breakers)
        self.builder = RequestBuilder(self.tokenizer, self.vocab_size, self.eos_token_ids, self.max_model_len,
                                      max_logprobs=config.model.max_logprobs, vision=self.runner.vision,
                                      image_processor=self._image_processor(), loras=self.lora_registry,
                                      base_model_names=frozenset(
                                          name for name in (self.model_name, config.model.model) if name),
                                      breakers=breakers, content_guard=self._content_guard(config.model),
                                      grammars=self.grammars, limits=config.limits, seed=config.model.request_seed,
                                      generation_defaults=self._generation_defaults(config.model))
        self.outputs = OutputProcessor(self.tokenizer)
        self.stats = EngineStats()
        log.info("engine ready", model=str(self.model_dir), num_kv_blocks=self.runner.num_kv_blocks,
                 block_size=config.cache.block_size, max_model_len=self.max_model_len)

    def _check_recurrent_state(self, config: EngineConfig) -> None:
        """A model with a state per sequence (linear-attention layers) runs without prefix caching, and
        refuses speculative decoding: a rejected draft would need the state from before it."""
        if not self.runner.has_recurrent_state:
            return
        architecture = self.runner.info.architecture
        if config.speculative is not None:
            self.runner.close()
            raise ValueError(f"speculative decoding is not supported for {architecture}: its linear-attention "
                             "layers keep a state per sequence that a rejected draft would have to undo")
        if config.cache.enable_prefix_caching:
            log.info("prefix caching off: the model keeps a recurrent state per sequence", architecture=architecture)

    def _features(self, config: EngineConfig) -> SchedulerFeatures:
        adapters = AdapterGate(self.lora_registry, self.lora_slots) \
            if self.lora_registry is not None and self.lora_slots is not None else None
        speculator = Speculator(config.speculative, self.draft_model) if config.speculative is not None else None
        return SchedulerFeatures(adapters, self.grammars, speculator)

    def _draft_model(self, config: EngineConfig) -> DraftModelProposer | None:
        """The draft model of draft-model speculation, beside the target in this process (None: none)."""
        spec = config.speculative
        if spec is None or not spec.uses_draft_model:
            return None
        return DraftModelProposer.load(spec, config.model, config.cache, config.scheduler, self.runner.vocab_size,
                                       self.runner.max_model_len, self.runner.num_kv_blocks)

    def _generation_defaults(self, model: ModelConfig) -> GenerationDefaults:
        defaults = load_generation_defaults(self.model_dir, model.generation_config)
        if defaults:  # as vLLM says: a request that sets none of these gets the model's values, not ours
            log.info("default sampling parameters from generation_config.json", **defaults.sampling,
                     max_new_tokens=defaults.max_tokens, source=model.generation_config)
        return defaults

    def _content_guard(self, model: ModelConfig) -> ChatContentGuard | None:
        if self.tokenizer is None or model.special_tokens_in_messages:
            return None
        guard = ChatContentGuard(self.tokenizer)
        if not guard.enabled:
            log.warning("this tokenizer does not list its special tokens: special-token text in chat messages "
                        "is read as special tokens")
        return guard

    def _image_processor(self) -> ImageProcessor | None:
        """A vision model's image preprocessing (preprocessor_config.json), checked against its vision tower."""
        if self.runner.vision is None:
            return None
        limits = ImageLimits(self.config.model.max_image_bytes, self.config.model.max_image_pixels)
        processor = ImageProcessor.from_model_dir(self.model_dir, limits)
        if processor.output_size != self.runner.vision.image_size:
            raise ValueError(f"preprocessor_config.json makes {processor.output_size} images; the vision tower "
                             f"takes {self.runner.vision.image_size}")
        return processor

    # ---- requests ------------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | Seq[int], params: SamplingParams,
                    images: Seq[bytes] | None = None, lora: str | None = None) -> Request:
        """Validate and queue a request (`images`: encoded, one per <image> of the prompt; `lora`: an
        adapter's name). Bad input raises ValueError naming the problem."""
        if isinstance(prompt, str):
            request = self.builder.build(request_id, params, prompt=prompt, images=images, lora=lora)
        else:
            request = self.builder.build(request_id, params, prompt_token_ids=prompt, images=images, lora=lora)
        self.add(request)
        return request

    def add(self, request: Request) -> None:
        """Queue a request built by `self.builder`; ValueError if its id runs or it cannot fit."""
        if request.request_id in self.scheduler.requests or self.outputs.has_request(request.request_id):
            raise ValueError(f"request id {request.request_id!r} is already running")
        self.scheduler.add_request(request)  # raises before Output learns of it
        self.outputs.add_request(request.request_id, request.prompt_token_ids, request.params)

    def abort_request(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> list[RequestDelta]:
        deltas, _ = self.outputs.process(self.scheduler.abort_request(request_id, reason))
        return deltas

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    # ---- one step ------------------------------------------------------------------------------

    def step(self) -> list[RequestDelta]:
        started = time.perf_counter()
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return []
        prepared = self.tensor_prep.prepare(plan)
        forward_started = time.perf_counter()
        logits = self.runner.execute(prepared.inputs)
        sample_started = time.perf_counter()
        result = sample_step(self.sampler, prepared, logits)
        self.stats.forward_seconds += sample_started - forward_started
        self.stats.sample_seconds += time.perf_counter() - sample_started
        deltas, stop_finishes = self.outputs.process(self.scheduler.apply_step_result(result))
        for finish in stop_finishes:
            self.scheduler.finish_by_stop_string(finish)
        self.stats.num_steps += 1
        if self.scheduler.speculator is not None:
            self.stats.num_draft_tokens = self.scheduler.speculator.num_draft_tokens
            self.stats.num_accepted_tokens = self.scheduler.speculator.num_accepted_tokens
        self.stats.step_seconds += time.perf_counter() - started
        return deltas
