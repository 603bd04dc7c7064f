"""Engine configuration: frozen dataclasses, validated on construction.

Each error names the field and the rule, so a bad CLI flag reads as a clear message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
DTYPES = ("auto", "float32", "float16", "bfloat16")
CPU_LINEARS = ("auto", "onednn", "torch")
QUANTIZATIONS = ("auto", "none", "gguf", "int8")  # weight-only, CPU (pipeline/model/layers/quantized_linear.py)
KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2")  # auto: the model's dtype (pipeline/model/attention/fp8_kv.py)
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")  # vLLM's flag values (docs/sampling.md, stage 14)


ATTENTION_BACKENDS = ("auto", "torch", "flex")
RUNNERS = ("auto", "generate", "pooling")  # vLLM's --runner; auto: pooling for encoder families
SCHEDULING_POLICIES = ("priority", "fcfs")
PREFILL_ORDERS = ("arrival", "burst", "shortest")  # SchedulerConfig.prefill_order


def parse_size(text: str | int) -> int:
    """'2GiB' -> 2147483648, '512MB' -> 512000000, 1024 -> 1024."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if match is None or match.group(2).upper() not in _SIZE_UNITS:
        raise ValueError(f"size must look like '2GiB', '512MB' or a byte count, got {text!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()])


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Which weights to load and how. `model=None` means the built-in default model."""

    # 'builtin', a packaged model's name, a .gguf file, a directory (pipeline/loading/model_source.py)
    model: str | None = None
    tokenizer: str | None = None  # a tokenizer directory other than the model's
    chat_template: str | None = None  # a Jinja chat template overriding the tokenizer's
    request_seed: int | None = None  # --seed: mixed into the derived seed of requests that give none
    dtype: str = "auto"  # auto (vLLM's): bfloat16 on CUDA and on CPUs with AVX512-BF16 or AMX, else float32
    device: str = "auto"  # auto: cuda when available, else cpu
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enforce_eager: bool = False  # disable CUDA graphs (always eager on CPU)
    seed: int = 0  # weight-independent engine seed (e.g. for profiling inputs)
    cpu_linear: str = "auto"  # CPU matmuls: oneDNN with packed weights (auto: plus native kernels for a
    # few rows and quantized weights), or torch's nn.Linear (model/cpu/linear.py)
    # gguf: keep a GGUF file's Q4_0/Q4_1/Q8_0 weights; int8: per-channel at load; auto: gguf for a model
    # converted from a GGUF file, on the CPU, with one rank (model/runner.py), else none
    quantization: str = "auto"
    # Quantized layers keep bfloat16 copies for many-row products on AMX or AVX512-BF16 CPUs, when they
    # fit this many GiB (bfloat16 models; 0 = never: model/layers/bf16_copies.py)
    bf16_copy_gib: float = 1.0
    # Every row's result the same bits whatever else shares its step (no many-row AMX products; a
    # speculative engine always is: model/runner.py exact_rows)
    batch_invariant: bool = False
    logprobs_mode: str = "processed_logprobs"  # returned logprobs: after the sampler chain, or the model's
    max_logprobs: int = 20  # the largest `logprobs` / `prompt_logprobs` a request may ask for
    tensor_parallel_size: int = 1  # ranks one model is split over (model/parallel/)
    attention_backend: str = "auto"  # auto: flex on CUDA, torch (+ native decode kernel) on CPU (model/attention/)
    max_image_bytes: int = 20 * 2**20  # vision models: the largest encoded image a request may send
    max_image_pixels: int = 6000 * 6000  # vision models: the largest image (width x height) a request may send
    # Read special-token text inside chat messages as special tokens (trusted clients only): by default
    # it stays text, so a message cannot forge role markers (pipeline/intake/chat_content.py).
    special_tokens_in_messages: bool = False
    # Request defaults from a generation_config.json: auto = the model's, vllm = none, or a directory
    # holding one (pipeline/loading/generation_config.py).
    generation_config: str = "auto"
    # generate: completions and chat; pooling: embeddings (pipeline/embedding_engine.py), with the
    # model directory's pooling unless these two say otherwise (pipeline/loading/pooling_config.py).
    runner: str = "auto"
    pooling_type: str | None = None  # MEAN, CLS or LAST
    normalize: bool | None = None

    def __post_init__(self) -> None:
        _require(self.dtype in DTYPES, f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        _require(self.runner in RUNNERS, f"runner must be one of {RUNNERS}, got {self.runner!r}")
        _require(self.pooling_type is None or self.pooling_type.upper() in ("MEAN", "CLS", "LAST"),
                 f"pooling_type must be MEAN, CLS or LAST, got {self.pooling_type!r}")
        _require(self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
                 f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        _require(self.max_model_len is None or self.max_model_len >= 1,
                 f"max_model_len must be >= 1, got {self.max_model_len}")
        _require(self.cpu_linear in CPU_LINEARS, f"cpu_linear must be one of {CPU_LINEARS}, got {self.cpu_linear!r}")
        _require(self.quantization in QUANTIZATIONS,
                 f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}")
        _require(self.logprobs_mode in LOGPROBS_MODES,
                 f"logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}")
        _require(bool(self.generation_config), "generation_config must be auto, vllm or a directory")
        _require(self.bf16_copy_gib >= 0, f"bf16_copy_gib must be >= 0, got {self.bf16_copy_gib}")
        _require(self.max_logprobs >= 0, f"max_logprobs must be >= 0, got {self.max_logprobs}")
        _require(self.tensor_parallel_size >= 1,
                 f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        # quantized linears hold packed blocks with no row/column split: they are not sharded across ranks
        _require(self.quantization in ("none", "auto") or self.tensor_parallel_size == 1,
                 f"quantization={self.quantization!r} does not support tensor_parallel_size > 1 "
                 f"(got {self.tensor_parallel_size}); use quantization='none' or tensor_parallel_size=1")
        _require(self.attention_backend in ATTENTION_BACKENDS,
                 f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        _require(self.max_image_bytes >= 1, f"max_image_bytes must be >= 1, got {self.max_image_bytes}")
        _require(self.max_image_pixels >= 1, f"max_image_pixels must be >= 1, got {self.max_image_pixels}")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Paged KV cache size. `num_kv_blocks` overrides every other sizing rule."""

    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory: int = 2 * 2**30  # bytes; the CPU sizing rule
    gpu_memory_utilization: float = 0.9  # the CUDA sizing rule (after profiling)
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"  # auto: the model's dtype; fp8_e4m3 / fp8_e5m2: one byte per element
    calculate_kv_scales: bool = False  # fp8: per-layer scales from the first prefill, not the checkpoint

    def __post_init__(self) -> None:
        _require(self.kv_cache_dtype in KV_CACHE_DTYPES,
                 f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        _require(not self.calculate_kv_scales or self.kv_cache_dtype != "auto",
                 "calculate_kv_scales needs kv_cache_dtype fp8_e4m3 or fp8_e5m2 (scales only apply to an fp8 cache)")
        _require(self.block_size >= 1 and self.block_size & (self.block_size - 1) == 0,
                 f"block_size must be a power of two >= 1, got {self.block_size}")
        _require(self.num_kv_blocks is None or self.num_kv_blocks >= 1,
                 f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        _require(self.kv_cache_memory >= 1, f"kv_cache_memory must be >= 1 byte, got {self.kv_cache_memory}")
        _require(0.0 < self.gpu_memory_utilization <= 1.0,
                 f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The per-step token budget (docs/design.md §4)."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    enable_chunked_prefill: bool = True
    # pipeline/scheduling/waiting_queue.py: "priority" serves lower `priority` first (equal ones in
    # arrival order, so with every request at 0 it is first come first served); "fcfs" ignores it.
    scheduling_policy: str = "priority"
    priority_aging_steps: int = 256  # a waiting sequence's priority improves by 1 per this many steps
    # Under "priority": prompt tokens of requests with priority > 0 (bulk) computed per step at most, so
    # a step of bulk prefill is short and a more urgent request arriving meanwhile waits for little.
    max_bulk_prefill_tokens: int | None = 512
    # Under "priority", when several tenants have work in a step, the busiest is held to the next one's
    # level of tokens, at least this many (pipeline/scheduling/tenant_shares.py); None: tenants share
    # steps as they come (seats are still shared fairly).
    fair_step_tokens: int | None = 8
    # Under "priority": the order equal priorities are admitted in (pipeline/scheduling/waiting_queue.py).
    # "arrival": fair share, then arrival (first come first served with one tenant); "burst": the same,
    # but the requests that arrive between two steps take their places fewest prompt tokens first, so a
    # burst's short prompts get their first tokens sooner and no request passes an earlier arrival;
    # "shortest": the fewest prompt tokens first, before fair share (benchmarks/prefill_order.py).
    prefill_order: str = "burst"
    # vLLM's knob of the same name: a sequence's prompt chunk in a step at most this many tokens (0: no
    # cap), so one long prompt cannot take a whole step's budget from the prompts beside it
    # (benchmarks/prefill_order.py --thresholds measures the trade-off).
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        _require(self.prefill_order in PREFILL_ORDERS,
                 f"prefill_order must be one of {PREFILL_ORDERS}, got {self.prefill_order!r}")
        _require(self.fair_step_tokens is None or self.fair_step_tokens >= 1,
                 f"fair_step_tokens must be >= 1 or None, got {self.fair_step_tokens}")
        _require(self.max_bulk_prefill_tokens is None or self.max_bulk_prefill_tokens >= 1,
                 f"max_bulk_prefill_tokens must be >= 1 or None, got {self.max_bulk_prefill_tokens}")
        _require(self.scheduling_policy in SCHEDULING_POLICIES,
                 f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got {self.scheduling_policy!r}")
        _require(self.priority_aging_steps >= 1,
                 f"priority_aging_steps must be >= 1, got {self.priority_aging_steps}")
        _require(self.max_num_batched_tokens >= 1,
                 f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        _require(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        _require(self.long_prefill_token_threshold >= 0,
                 f"long_prefill_token_threshold must be >= 0, got {self.long_prefill_token_threshold}")


@dataclass(frozen=True, slots=True)
class LoRAConfig:
    """Multi-LoRA (pipeline/lora/): adapters loaded at start, device slots, host cache, rank limit."""

    modules: tuple[tuple[str, str], ...] = ()  # (name, PEFT directory) loaded at start
    max_loras: int = 4  # adapters resident in device slots at once (and so per step)
    max_cpu_loras: int | None = None  # adapters kept in host memory (LRU); None: 2 x max_loras
    max_lora_rank: int = 64

    def __post_init__(self) -> None:
        _require(self.max_loras >= 1, f"max_loras must be >= 1, got {self.max_loras}")
        _require(self.max_cpu_loras is None or self.max_cpu_loras >= 1,
                 f"max_cpu_loras must be >= 1, got {self.max_cpu_loras}")
        _require(self.max_lora_rank >= 1, f"max_lora_rank must be >= 1, got {self.max_lora_rank}")
        names = [name for name, _ in self.modules]
        _require(all(names), "lora_modules: every adapter needs a name (NAME=DIR)")
        _require(len(set(names)) == len(names), f"lora_modules: adapter names must be unique, got {names}")

    @property
    def host_capacity(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else 2 * self.max_loras


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Per-request bounds a deployment may lower (--max-stop-strings ...; docs/safety.md). Each is at
    most SamplingParams' own ceiling (LIST_LIMITS), which every path checks, flags or not."""

    max_stop_strings: int = 64
    max_dry_breakers: int = 64
    max_logit_bias: int = 1024
    max_token_bans: int = 4096  # custom_token_bans
    max_prompt_chars_per_token: int = 64  # a prompt longer than max_model_len x this is refused untokenized

    def __post_init__(self) -> None:
        from pipeline.request.sampling_params import LIST_LIMITS

        ceilings = {name: most for name, most, _ in LIST_LIMITS}
        for flag, field_name in (("max_stop_strings", "stop"), ("max_dry_breakers", "dry_sequence_breakers"),
                                 ("max_logit_bias", "logit_bias"), ("max_token_bans", "custom_token_bans")):
            value, ceiling = getattr(self, flag), ceilings[field_name]
            _require(0 <= value <= ceiling, f"{flag} must be in [0, {ceiling}], got {value}")
        _require(self.max_prompt_chars_per_token >= 1,
                 f"max_prompt_chars_per_token must be >= 1, got {self.max_prompt_chars_per_token}")


SPECULATIVE_METHODS = ("ngram", "draft_model")
NGRAM_MODEL_NAMES = (None, "ngram", "[ngram]")  # a `model` that means prompt lookup (Aphrodite's spelling)
_NGRAM_KEYS = ("prompt_lookup_max", "prompt_lookup_min")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """Speculative decoding (docs/speculative.md): each decoding sequence drafts up to
    `num_speculative_tokens` tokens, by prompt lookup (method "ngram": copy what followed the longest
    earlier occurrence, between `prompt_lookup_min` and `prompt_lookup_max` tokens, of its own suffix)
    or by a draft model's greedy tokens (method "draft_model", `model` a directory or GGUF file with
    the target's vocabulary); the target verifies them."""

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    # No drafting while more sequences than this run: on a busy batch the extra query rows cost more
    # compute than the saved steps give back (vLLM's key; None = always draft).
    disable_by_batch_size: int | None = 16
    model: str | None = None  # the draft model (method "draft_model" only)

    def __post_init__(self) -> None:
        _require(self.method in SPECULATIVE_METHODS,
                 f"speculative_config.method must be one of {SPECULATIVE_METHODS}, got {self.method!r}")
        if self.method == "draft_model":
            _require(isinstance(self.model, str) and self.model != "",
                     f"speculative_config.model must name the draft model (a directory or GGUF file) "
                     f"for method 'draft_model', got {self.model!r}")
        else:
            _require(self.model is None, f"speculative_config.model: method 'ngram' takes no draft model, "
                                         f"got {self.model!r}")
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            value = getattr(self, name)
            _require(type(value) is int, f"speculative_config.{name} must be an integer, got {value!r}")
        _require(1 <= self.num_speculative_tokens <= 64,
                 f"speculative_config.num_speculative_tokens must be in [1, 64], got {self.num_speculative_tokens}")
        _require(self.prompt_lookup_min >= 1,
                 f"speculative_config.prompt_lookup_min must be >= 1, got {self.prompt_lookup_min}")
        _require(self.disable_by_batch_size is None
                 or (type(self.disable_by_batch_size) is int and self.disable_by_batch_size >= 1),
                 f"speculative_config.disable_by_batch_size must be an integer >= 1 or null, "
                 f"got {self.disable_by_batch_size!r}")
        _require(self.prompt_lookup_min <= self.prompt_lookup_max <= 1024,
                 f"speculative_config.prompt_lookup_max must be in [prompt_lookup_min ({self.prompt_lookup_min}), "
                 f"1024], got {self.prompt_lookup_max}")

    @property
    def uses_draft_model(self) -> bool:
        return self.method == "draft_model"

    @classmethod
    def from_dict(cls, data: object) -> SpeculativeConfig:
        """vLLM's --speculative-config map: a `model` other than "[ngram]" is a draft model (method
        "draft_model"); unknown keys, and prompt-lookup keys beside a draft model, are errors that name them."""
        if not isinstance(data, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {type(data).__name__}")
        known = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                 "disable_by_batch_size", "model"}
        unknown = sorted(str(key) for key in data if key not in known)
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(known))})")
        values = dict(data)
        model = values.pop("model", None)
        if model in NGRAM_MODEL_NAMES:
            return cls(**values)
        method = values.setdefault("method", "draft_model")
        if method != "draft_model":
            raise ValueError(f"speculative_config.model: method {method!r} takes no draft model, got {model!r} "
                             f"(a draft model is method 'draft_model')")
        beside = [key for key in _NGRAM_KEYS if key in values]
        if beside:
            raise ValueError(f"speculative_config: {', '.join(beside)} apply to prompt lookup only, "
                             f"not to a draft model")
        return cls(model=model, **values)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    lora: LoRAConfig | None = None  # None: LoRA disabled (no slots, no wrappers)
    limits: RequestLimits = field(default_factory=RequestLimits)
    speculative: SpeculativeConfig | None = None  # None: no speculative decoding
