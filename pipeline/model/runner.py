"""ModelRunner: owns the weights and the paged KV cache; turns StepInputs into logits.

KV cache: one tensor per layer, [2, blocks, block_size, num_kv_heads, head_dim] (multi-head latent
attention: [blocks, block_size, 1, latent row], attention/latent.py), in the model's dtype, or fp8
bytes wrapped with the layer's scales (attention/fp8_kv.py). When CUDA graphs are used, one extra
block past num_kv_blocks is a scratch block that graph padding rows write into; the scheduler never
sees it.

Models with linear-attention layers (Qwen3-Next, Qwen3.5) also keep a recurrent state per running
sequence: a pool of max_num_seqs slots (layers/recurrent_state.py), allocated before the KV cache is
sized (the CPU budget and the CUDA profile both count it), indexed by each step's state_slots. Such a
model runs eager (no CUDA graphs), on one rank, and serves generation only (decoder_pooling.py refuses it).
"""

from __future__ import annotations

import math
import mmap
import time
from dataclasses import replace

import numpy as np
import structlog
import torch

from pipeline.config import CacheConfig, LoRAConfig, ModelConfig, SchedulerConfig
from pipeline.host_to_device import to_device
from pipeline.loading.cache_dir import cache_dir
from pipeline.lora.registry import LoRARegistry
from pipeline.model.attention.fp8_kv import FP8_DTYPES, Fp8KVCache, allocate_fp8_caches
from pipeline.model.attention.paged import TorchPagedAttention
from pipeline.model.attention.selection import make_backend
from pipeline.model.cpu.linear import prepare_cpu_linears
from pipeline.model.encoder_cache import EncoderCache
from pipeline.model.graphs import CUDAGraphRunner
from pipeline.model.layers.amx_routing import route_many_rows
from pipeline.model.layers.norms import use_native_norms
from pipeline.model.layers.quantize import auto_quantization, quantize_linears
from pipeline.model.layers.quantized_linear import native_kernel_for, quantized_kernels_work
from pipeline.model.layers.recurrent_state import RecurrentStatePool
from pipeline.model.loader import (
    ModelInfo,
    attention_shape,
    language_config,
    load_model,
    read_config,
    recurrent_state_shape,
    resolve_device,
    resolve_dtype,
)
from pipeline.model.lora import LoRASlotTensors
from pipeline.model.memory_profile import profile_memory
from pipeline.model.native_decode import ANY_ROWS, NativeDecoder
from pipeline.model.parallel.group import DriverGroup, check_world, rank_device, receive_steps, smallest_across_ranks
from pipeline.model.parallel.sharding import check_tensor_parallel, local_heads, shard_model
from pipeline.request.image_input import VisionInfo
from pipeline.step.inputs import StepInputs

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
        max_query_len=int(lens.max()), max_seq_len=int(lens.max()), state_slots=np.arange(num_seqs, dtype=np.int32))


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


def _rank_main(rank: int, world: int, model_config: ModelConfig, cache_config: CacheConfig,
               scheduler_config: SchedulerConfig, model_dir: str) -> None:
    """A tensor-parallel rank process (parallel/group.py): its own shard of the model and KV cache."""
    runner = ModelRunner(model_config, cache_config, scheduler_config, model_dir, tp_rank=rank)
    receive_steps(runner.execute, runner.device)


class ModelRunner:
    def __init__(self, model_config: ModelConfig, cache_config: CacheConfig,
                 scheduler_config: SchedulerConfig, model_dir: str, lora_config: LoRAConfig | None = None,
                 tp_rank: int = 0, exact_rows: bool = False) -> None:
        """tp_rank: this process's rank with tensor_parallel_size > 1 (0 = the driver, which starts
        the other ranks and broadcasts each step's inputs to them). exact_rows: every row's result the
        same bits whatever rows share a step, up to the kernels' limits (speculative decoding's
        verification needs it: docs/speculative.md), so no many-row AMX paths (layers/amx_routing.py)."""
        self.exact_rows = exact_rows
        if lora_config is not None and model_config.tensor_parallel_size > 1:
            # The ranks would need the adapters' shards and each step's slot mapping: not built yet.
            raise ValueError("LoRA adapters with --tensor-parallel-size > 1 are not supported yet")
        self.tp_rank, self.tp_world = tp_rank, model_config.tensor_parallel_size
        self.device = rank_device(resolve_device(model_config.device), tp_rank)
        self.tp_group: DriverGroup | None = None
        if self.tp_world > 1 and tp_rank == 0:
            config = read_config(model_dir)
            if recurrent_state_shape(config) is not None:
                raise ValueError(f"tensor parallelism does not support models with linear-attention layers "
                                 f"({config['architectures'][0]}) yet (run them with tensor_parallel_size 1)")
            check_tensor_parallel(config, attention_shape(config), self.tp_world)  # errors before any rank starts
            check_world(self.tp_world, self.device)
            self.tp_group = DriverGroup(self.tp_world, _rank_main,
                                        (model_config, cache_config, scheduler_config, model_dir), self.device)
        self.dtype = resolve_dtype(model_config.dtype, self.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # graph capture and profiling use the current device
        self.block_size = cache_config.block_size
        max_positions = language_config(read_config(model_dir))["max_position_embeddings"]
        self.max_model_len = model_config.max_model_len or max_positions
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        # fp8: the cache's storage dtype and the checkpoint's per-layer scales; None = the model's dtype.
        self.kv_dtype = FP8_DTYPES.get(cache_config.kv_cache_dtype)
        self.kv_scales: dict[int, dict[str, float]] = {}
        self.model, self.info = self._load(model_config, model_dir)
        self.lora: LoRASlotTensors | None = None
        self.lora_registry: LoRARegistry | None = None
        if lora_config is not None:  # wraps the projections, packed or not, before graphs capture them
            self.lora = LoRASlotTensors(self.model, lora_config.max_loras, lora_config.max_lora_rank, self.dtype,
                                        self.device)
            self.lora_registry = LoRARegistry(self.lora.shapes, lora_config.max_lora_rank,
                                              lora_config.host_capacity, copies_dir=cache_dir() / "lora")
        self.vision, self.encoder_cache = self._vision_parts()
        self._use_native_decoder()
        self.vocab_size = self.info.vocab_size
        self.eos_token_ids = self.info.eos_token_ids
        self.state_pool = self._allocate_state_pool()  # before the KV cache is sized: both count it
        # Tensor-parallel steps run eager: capturing NCCL collectives in CUDA graphs is not built yet; nor
        # are graphs that read and write the recurrent-state pool.
        self.use_graphs = (self.device.type == "cuda" and not model_config.enforce_eager and self.tp_world == 1
                           and self.state_pool is None)
        self.num_kv_blocks = self._decide_num_blocks(cache_config)
        self.kv_caches = self._allocate_kv_caches(self.num_kv_blocks + int(self.use_graphs))
        self.graph_runner = self._capture_graphs() if self.use_graphs else None
        log.info("model runner ready", device=str(self.device), dtype=str(self.dtype),
                 num_kv_blocks=self.num_kv_blocks, block_size=self.block_size,
                 max_model_len=self.max_model_len, cuda_graphs=self.use_graphs,
                 attention_backend=type(self.backend).__name__, kv_cache_dtype=cache_config.kv_cache_dtype,
                 checkpoint_kv_scales=len(self.kv_scales),
                 recurrent_state_bytes=self.state_pool.num_bytes if self.state_pool is not None else 0)

    def _load(self, model_config: ModelConfig, model_dir: str) -> tuple[torch.nn.Module, ModelInfo]:
        config = read_config(model_dir)
        shape = attention_shape(config)
        heads = local_heads(shape, self.tp_rank, self.tp_world)
        local_shape = replace(shape, num_heads=heads.num_heads, num_kv_heads=heads.num_kv_heads)
        self.backend = make_backend(model_config.attention_backend, local_shape, self.block_size, self.device,
                                    self.dtype)
        if self.kv_dtype is not None and shape.latent_dim is not None:
            raise ValueError(f"kv_cache_dtype {self.cache_config.kv_cache_dtype} is not supported with multi-head "
                             "latent attention (DeepSeek-V2/V3) yet: use kv_cache_dtype 'auto'")
        if self.kv_dtype is not None and isinstance(self.backend, TorchPagedAttention):
            self.backend.prefill_rows_max_len = 0  # a first fp8 chunk attends to its fresh K/V, not the cache's
        if self.kv_dtype is not None and not isinstance(self.backend, TorchPagedAttention):
            raise ValueError(f"kv_cache_dtype {self.cache_config.kv_cache_dtype} needs attention_backend 'torch'; "
                             f"{type(self.backend).__name__} does not read an fp8 cache yet")
        model, info = load_model(model_dir, self.backend, dtype=self.dtype, device=self.device,
                                 max_positions=max(self.max_model_len,
                                                   language_config(config)["max_position_embeddings"]),
                                 kv_scales=self.kv_scales)
        if self.tp_world > 1:
            shard_model(model, shape, self.tp_rank, self.tp_world)
            info = replace(info, num_heads=heads.num_heads, num_kv_heads=heads.num_kv_heads)
        native = native_kernel_for(model_config.cpu_linear)
        quantization = model_config.quantization
        if quantization == "auto":
            quantization = auto_quantization(model_dir, self.device.type == "cpu", self.tp_world,
                                             native is not None or quantized_kernels_work())
            log.info("quantization", auto=quantization)
        if quantization != "none":  # before pack_linears, and before LoRA wraps the projections
            self._check_quantization(quantization, native is not None)
            quantize_linears(model, quantization, model_dir, native)
        if self.device.type == "cpu" and model_config.cpu_linear != "torch":  # torch: HF's kernels, bit for bit
            log.info("CPU linear layers", cpu_linear=model_config.cpu_linear,
                     **prepare_cpu_linears(model, model_config.cpu_linear, self.dtype))
            log.info("native RMSNorm", count=use_native_norms(model))
        if self.device.type == "cpu":
            route_many_rows(model, native, self.dtype, int(model_config.bf16_copy_gib * 2**30), self.exact_rows)
        return model, info

    @property
    def native_decoder(self) -> NativeDecoder | None:
        """The decode steps' one-call layers (native_decode.py), or None where the model does not qualify."""
        return getattr(getattr(self.model, "language_model", self.model), "native_decoder", None)

    def _use_native_decoder(self) -> None:
        """Decode steps' layers in one native call where the model qualifies (native_decode.py); after
        LoRA, whose wrappers it leaves to the per-op path."""
        if self.device.type != "cpu":
            return
        decoder = NativeDecoder.build(self.model)
        if decoder is not None:
            getattr(self.model, "language_model", self.model).native_decoder = decoder
        rows = decoder.max_rows if decoder is not None else 0
        log.info("native decoder layers", enabled=decoder is not None, max_rows="any" if rows == ANY_ROWS else rows)

    def _check_quantization(self, mode: str, native: bool) -> None:
        if self.device.type != "cpu":
            raise ValueError(f"quantization {mode!r} runs on the CPU only (device is {self.device})")
        if not native and not quantized_kernels_work():
            raise ValueError(f"quantization {mode!r} needs torch's CPU int8/int4 kernels (torch >= 2.5)")

    def _vision_parts(self) -> tuple[VisionInfo | None, EncoderCache | None]:
        """What intake needs to know of a vision-language model, and its encoder's cache (None, None: text only)."""
        spec = getattr(self.model, "spec", None)
        if spec is None:
            return None, None
        size = spec.vision.image_size
        info = VisionInfo(spec.image_token_id, spec.num_image_tokens, (size, size))
        return info, EncoderCache(self.model.encode_images, self.device)

    @property
    def has_recurrent_state(self) -> bool:
        """The model keeps a state per sequence (linear-attention layers): no prefix caching, forks or drafts."""
        return self.state_pool is not None

    def _allocate_state_pool(self) -> RecurrentStatePool | None:
        shape = self.info.recurrent_state
        if shape is None:
            return None
        zeros = lazy_zeros if self.device.type == "cpu" else None  # pages touched as slots are first used
        return RecurrentStatePool(shape, self.scheduler_config.max_num_seqs, self.dtype, self.device, zeros)

    # ---- KV cache sizing -----------------------------------------------------------------------

    @property
    def bytes_per_block(self) -> int:
        elem = torch.empty(0, dtype=self.kv_dtype or self.dtype).element_size()
        return math.prod(self._cache_shape(1)) * elem * self.info.num_layers

    def _cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        """One layer's cache on this rank (its own KV heads under tensor parallelism)."""
        info = self.info
        if info.attention.latent_dim is not None:  # one latent row per token (attention/latent.py)
            return info.attention.cache_shape(num_blocks, self.block_size)
        return (2, num_blocks, self.block_size, info.num_kv_heads, info.head_dim)

    def _decide_num_blocks(self, cache_config: CacheConfig) -> int:
        if cache_config.num_kv_blocks is not None:
            return cache_config.num_kv_blocks
        if self.device.type != "cuda":
            return max(1, self._cpu_kv_budget(cache_config.kv_cache_memory) // self.bytes_per_block)
        return self._profile_num_blocks(cache_config.gpu_memory_utilization)

    def _cpu_kv_budget(self, kv_cache_memory: int) -> int:
        """kv_cache_memory less the recurrent-state pool, which it covers too."""
        if self.state_pool is None:
            return kv_cache_memory
        budget = kv_cache_memory - self.state_pool.num_bytes
        if budget < self.bytes_per_block:
            raise ValueError(f"kv_cache_memory ({kv_cache_memory / 2**20:.0f} MiB) must hold the recurrent state of "
                             f"max_num_seqs {self.scheduler_config.max_num_seqs} sequences "
                             f"({self.state_pool.num_bytes / 2**20:.0f} MiB) and at least one KV block "
                             f"({self.bytes_per_block} bytes): raise kv_cache_memory or lower max_num_seqs")
        return budget

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
        if self.tp_world > 1:  # each rank profiled its own device; the driver's block ids must fit them all
            num_blocks = smallest_across_ranks(num_blocks, self.device)
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

    def _allocate_kv_caches(self, num_blocks: int) -> list[torch.Tensor] | list[Fp8KVCache]:
        info = self.info
        shape = self._cache_shape(num_blocks)
        dtype = self.kv_dtype or self.dtype
        # Zeroed, not empty: masked (unwritten) slots get zero attention weight, but 0 * NaN from
        # recycled memory would still poison the output.
        if self.device.type == "cpu":
            caches = [lazy_zeros(shape, dtype) for _ in range(info.num_layers)]
        else:
            caches = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(info.num_layers)]
        if self.kv_dtype is None:
            return caches
        return allocate_fp8_caches(caches, self.kv_scales, self.cache_config.calculate_kv_scales)

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
        if self.state_pool is not None:
            states = self.state_pool.step(inputs.positions, inputs.query_start_loc, inputs.seq_lens, inputs.state_slots)
            return self.model(input_ids, positions, metadata, kv_caches, states=states)
        if inputs.images and self.encoder_cache is not None:
            images = self.encoder_cache.embeddings(inputs.images)
            return self.model(input_ids, positions, metadata, kv_caches, images=images)
        return self.model(input_ids, positions, metadata, kv_caches)

    def execute(self, inputs: StepInputs) -> torch.Tensor:
        """Float32 logits [len(logits_indices), vocab_size] on self.device."""
        if self.tp_group is None:
            return self._execute(inputs)
        with self.tp_group.collectives():
            self.tp_group.broadcast(inputs)
            return self._execute(inputs)

    def _execute(self, inputs: StepInputs) -> torch.Tensor:
        with torch.inference_mode():
            self._prepare_lora(inputs)
            eager_only = inputs.lora_slots is not None or bool(inputs.images)
            if self.graph_runner is not None and not eager_only and self.graph_runner.can_run(inputs):
                hidden = self.graph_runner.run(inputs)
            else:
                hidden = self._forward(inputs, self.kv_caches)
            logits_indices = to_device(inputs.logits_indices, self.device, torch.long)
            return self.model.compute_logits(hidden[logits_indices])

    def hidden_states(self, inputs: StepInputs) -> torch.Tensor:
        """The final (normed) hidden states [num_tokens, hidden_size] of every token, for pooling
        (pipeline/model/decoder_pooling.py): eager, one rank, no adapters or images."""
        if self.tp_group is not None:
            raise ValueError("pooling runs on one rank: --tensor-parallel-size must be 1")
        with torch.inference_mode():
            return self._forward(inputs, self.kv_caches)[: inputs.num_tokens]

    def close(self) -> None:
        """Stop the tensor-parallel ranks (a no-op without them)."""
        if self.tp_group is not None:
            self.tp_group.close()

    def _prepare_lora(self, inputs: StepInputs) -> None:
        """Copy newly assigned adapters into their slots and group this step's tokens by slot."""
        if self.lora is None or self.lora_registry is None:
            return
        self.lora.load({slot: self.lora_registry.adapter(adapter_id) for slot, adapter_id in inputs.lora_loads.items()})
        self.lora.step.set(inputs.lora_slots)
