"""ModelRunner: owns the weights and the paged KV cache; turns StepInputs into logits.

KV cache: one tensor per layer, [2, blocks, block_size, num_kv_heads, head_dim]. When CUDA
graphs are used, one extra block past num_kv_blocks is a scratch block that graph padding rows
write into; the scheduler never sees it.
"""

from __future__ import annotations

import math
import mmap
import time

import numpy as np
import structlog
import torch

from pipeline.config import CacheConfig, ModelConfig, SchedulerConfig
from pipeline.host_to_device import to_device
from pipeline.image_input import VisionInfo
from pipeline.model.backends import make_backend
from pipeline.model.cpu_linear import onednn_linear_works, pack_linears
from pipeline.model.encoder_cache import EncoderCache
from pipeline.model.graphs import CUDAGraphRunner
from pipeline.model.loader import (
    ModelInfo,
    attention_shape,
    language_config,
    load_model,
    read_config,
    resolve_device,
    resolve_dtype,
)
from pipeline.model.memory_profile import profile_memory
from pipeline.step_inputs import StepInputs

log = structlog.get_logger(__name__)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def dummy_prefill_inputs(num_tokens: int, num_seqs: int, max_len: int) -> StepInputs:
    """A first-chunk prefill of num_tokens tokens over num_seqs sequences; writes nothing (slots -1).

    num_tokens 10, num_seqs 3 -> query lens [4, 3, 3], positions [0 1 2 3 0 1 2 0 1 2]
    """
    num_seqs = max(1, min(num_seqs, num_tokens))
    lens = np.full(num_seqs, num_tokens // num_seqs, dtype=np.int64)
    lens[: num_tokens % num_seqs] += 1
    lens = np.minimum(lens, max_len)
    starts = np.concatenate([[0], np.cumsum(lens)])
    total = int(starts[-1])
    positions = np.arange(total) - np.repeat(starts[:-1], lens)
    return StepInputs(
        input_ids=np.zeros(total, dtype=np.int64), positions=positions,
        slot_mapping=np.full(total, -1, dtype=np.int64), query_start_loc=starts.astype(np.int32),
        seq_lens=lens.astype(np.int32), block_tables=np.zeros((num_seqs, 1), dtype=np.int32),
        logits_indices=(starts[1:] - 1).astype(np.int64), num_tokens=total,
        max_query_len=int(lens.max()), max_seq_len=int(lens.max()))


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero CPU tensor whose pages are only touched when first written.

    torch.zeros writes every byte up front: about 2.7 s of start-up for the default 2 GiB cache here,
    most of which a small workload never uses. Anonymous mmap memory reads as zero (the kernel maps
    a shared zero page until a page is written), so the tensor is zero from the start at no cost.
    """
    count = math.prod(shape)
    if count == 0:
        return torch.zeros(shape, dtype=dtype)
    buffer = mmap.mmap(-1, count * torch.empty(0, dtype=dtype).element_size())
    # The tensor holds a reference to the buffer, which keeps the mapping alive.
    return torch.frombuffer(buffer, dtype=dtype, count=count).view(shape)


class ModelRunner:
    def __init__(self, model_config: ModelConfig, cache_config: CacheConfig,
                 scheduler_config: SchedulerConfig, model_dir: str) -> None:
        self.device = resolve_device(model_config.device)
        self.dtype = resolve_dtype(model_config.dtype, self.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # graph capture and profiling use the current device
        self.block_size = cache_config.block_size
        max_positions = language_config(read_config(model_dir))["max_position_embeddings"]
        self.max_model_len = model_config.max_model_len or max_positions
        self.scheduler_config = scheduler_config
        self.model, self.info = self._load(model_config, model_dir)
        self.vision, self.encoder_cache = self._vision_parts()
        self.vocab_size = self.info.vocab_size
        self.eos_token_ids = self.info.eos_token_ids
        self.use_graphs = self.device.type == "cuda" and not model_config.enforce_eager
        self.num_kv_blocks = self._decide_num_blocks(cache_config)
        self.kv_caches = self._allocate_kv_caches(self.num_kv_blocks + int(self.use_graphs))
        self.graph_runner = self._capture_graphs() if self.use_graphs else None
        log.info("model runner ready", device=str(self.device), dtype=str(self.dtype),
                 num_kv_blocks=self.num_kv_blocks, block_size=self.block_size,
                 max_model_len=self.max_model_len, cuda_graphs=self.use_graphs,
                 attention_backend=type(self.backend).__name__)

    def _load(self, model_config: ModelConfig, model_dir: str) -> tuple[torch.nn.Module, ModelInfo]:
        config = read_config(model_dir)
        shape = attention_shape(config)
        self.backend = make_backend(model_config.attention_backend, shape, self.block_size, self.device, self.dtype)
        model, info = load_model(model_dir, self.backend, dtype=self.dtype, device=self.device,
                                 max_positions=max(self.max_model_len,
                                                   language_config(config)["max_position_embeddings"]))
        if self.device.type == "cpu" and model_config.cpu_linear == "onednn" and onednn_linear_works(self.dtype):
            log.info("linear layers packed for oneDNN", count=pack_linears(model))
        return model, info

    def _vision_parts(self) -> tuple[VisionInfo | None, EncoderCache | None]:
        """What intake needs to know of a vision-language model, and its encoder's cache (None, None: text only)."""
        spec = getattr(self.model, "spec", None)
        if spec is None:
            return None, None
        size = spec.vision.image_size
        info = VisionInfo(spec.image_token_id, spec.num_image_tokens, (size, size))
        return info, EncoderCache(self.model.encode_images, self.device)

    # ---- KV cache sizing -----------------------------------------------------------------------

    @property
    def bytes_per_block(self) -> int:
        info = self.info
        elem = torch.empty(0, dtype=self.dtype).element_size()
        return 2 * self.block_size * info.num_kv_heads * info.head_dim * elem * info.num_layers

    def _decide_num_blocks(self, cache_config: CacheConfig) -> int:
        if cache_config.num_kv_blocks is not None:
            return cache_config.num_kv_blocks
        if self.device.type != "cuda":
            return max(1, cache_config.kv_cache_memory // self.bytes_per_block)
        return self._profile_num_blocks(cache_config.gpu_memory_utilization)

    def _profile_num_blocks(self, gpu_memory_utilization: float) -> int:
        """Measure a max-size step (and a max-batch decode when graphs are on) without a KV cache;
        whatever stays under the utilization limit holds KV (model/memory_profile.py)."""
        sched = self.scheduler_config
        scratch = self._allocate_kv_caches(1)

        def run(inputs: StepInputs, with_images: bool) -> None:
            with torch.inference_mode():
                hidden = self._forward(inputs, scratch)
                self.model.compute_logits(hidden[to_device(inputs.logits_indices, self.device, torch.long)])
                if with_images:
                    self._profile_vision_tower(sched.max_num_batched_tokens)

        prefill = dummy_prefill_inputs(sched.max_num_batched_tokens, sched.max_num_seqs, self.max_model_len)
        decode = dummy_prefill_inputs(sched.max_num_seqs, sched.max_num_seqs, 1)  # one token per sequence
        profile = profile_memory(self.device, lambda: run(prefill, True), lambda: run(decode, False),
                                 sched.max_num_seqs, self.vocab_size, self.use_graphs)
        num_blocks = profile.kv_cache_bytes(gpu_memory_utilization) // self.bytes_per_block
        log.info("kv cache sized", num_blocks=num_blocks, bytes_per_block=self.bytes_per_block)
        if num_blocks < 1:
            raise ValueError(f"no memory left for the KV cache: {profile}; "
                             "raise gpu_memory_utilization or lower max_num_batched_tokens / max_num_seqs")
        return num_blocks

    def _profile_vision_tower(self, max_num_batched_tokens: int) -> None:
        """A vision model encodes up to a step's worth of images at once: count that peak too."""
        if self.vision is None:
            return
        num_images = max(1, max_num_batched_tokens // self.vision.num_image_tokens)
        self.model.encode_images(torch.zeros(num_images, 3, *self.vision.image_size, device=self.device))

    def _allocate_kv_caches(self, num_blocks: int) -> list[torch.Tensor]:
        info = self.info
        shape = (2, num_blocks, self.block_size, info.num_kv_heads, info.head_dim)
        # Zeroed, not empty: masked (unwritten) slots get zero attention weight, but 0 * NaN from
        # recycled memory would still poison the output.
        if self.device.type == "cpu":
            return [lazy_zeros(shape, self.dtype) for _ in range(info.num_layers)]
        return [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(info.num_layers)]

    def _capture_graphs(self) -> CUDAGraphRunner:
        start = time.perf_counter()
        max_blocks_per_seq = _cdiv(self.max_model_len, self.block_size)
        with torch.inference_mode():
            runner = CUDAGraphRunner(self.model, self.backend, self.kv_caches,
                                     self.scheduler_config.max_num_seqs, max_blocks_per_seq,
                                     scratch_slot=self.num_kv_blocks * self.block_size, device=self.device)
        log.info("graph capture done", seconds=round(time.perf_counter() - start, 2))
        return runner

    # ---- the step ------------------------------------------------------------------------------

    def _forward(self, inputs: StepInputs, kv_caches: list[torch.Tensor]) -> torch.Tensor:
        input_ids = to_device(inputs.input_ids, self.device, torch.long)
        positions = to_device(inputs.positions, self.device, torch.long)
        metadata = self.backend.build_metadata(inputs, self.device)
        if inputs.images and self.encoder_cache is not None:
            images = self.encoder_cache.embeddings(inputs.images)
            return self.model(input_ids, positions, metadata, kv_caches, images=images)
        return self.model(input_ids, positions, metadata, kv_caches)

    def execute(self, inputs: StepInputs) -> torch.Tensor:
        """Float32 logits [len(logits_indices), vocab_size] on self.device."""
        with torch.inference_mode():
            if self.graph_runner is not None and not inputs.images and self.graph_runner.can_run(inputs):
                hidden = self.graph_runner.run(inputs)
            else:
                hidden = self._forward(inputs, self.kv_caches)
            logits_indices = to_device(inputs.logits_indices, self.device, torch.long)
            return self.model.compute_logits(hidden[logits_indices])
