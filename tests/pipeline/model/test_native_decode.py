"""The native decoder layers (native_decode.py): a decode step's layers in one C call give the per-op
path's tokens and logprobs bit for bit, across dtypes, quantization, batch sizes (below and above
the kernels' row limit), sliding windows and biases; models it does not serve keep the per-op path."""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import pytest
import torch
import transformers

from pipeline.config import CacheConfig, EngineConfig, LoRAConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine
from pipeline.model.cpu.gguf_kernel import load_gguf_linear_kernel
from pipeline.model.cpu.kernels import load_decoder_layers, load_panel_linear_kernel, load_quantized_linear_kernel
from pipeline.model.cpu.library import cpu_flags
from pipeline.model.cpu.linear import PackedLinear
from pipeline.model.layers.bf16_copies import COPY_MIN_ROWS, copy_panel_kernel, copy_takes
from pipeline.model.layers.gguf_linear import dequantize_min_rows as gguf_dequantize_min_rows
from pipeline.model.layers.quantized_linear import AMX_MIN_ROWS, Int4Linear, dequantize_min_rows
from pipeline.model.native_decode import ANY_ROWS, NativeDecoder
from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import make_engine, run_requests
from tests.support.gguf_files import write_gguf
from tests.support.hf_models import make_tiny_hf_model

pytestmark = pytest.mark.skipif(load_decoder_layers() is None, reason="no C compiler")
TILE_ROWS = 8  # panel_linear.c's rows a tile: steps of more rows run several tiles over each panel


def _amx_for_4bit() -> bool:
    kernel = load_quantized_linear_kernel()
    return kernel is not None and kernel.int4_amx_available


def _engine(model_dir: Path, dtype: str, quantization: str = "none", lora: LoRAConfig | None = None,
            max_num_batched_tokens: int = 256) -> LLMEngine:
    return LLMEngine(EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype=dtype, quantization=quantization),
        cache=CacheConfig(block_size=8, num_kv_blocks=256),
        scheduler=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=16), lora=lora))


def _requests(count: int) -> dict[str, tuple[list[int], SamplingParams]]:
    """`count` greedy requests with prompts of 3-40 tokens and 12-30 new tokens (so decode batches
    shrink as they finish), with logprobs."""
    return {f"r{i}": ([1 + i, *range(5 + i, 5 + i + 3 + (i * 7) % 38)],
                      SamplingParams(max_tokens=12 + (i * 5) % 19, temperature=0.0, ignore_eos=True, logprobs=2))
            for i in range(count)}


def _outputs(engine: LLMEngine, requests: dict) -> dict[str, tuple[list[int], list[float]]]:
    results = run_requests(engine, requests)
    choices = {request_id: result["choices"][0] for request_id, result in results.items()}
    return {request_id: (choice["token_ids"], [entry.logprob for entry in choice["logprobs"]])
            for request_id, choice in choices.items()}


def _counting(engine: LLMEngine) -> tuple[list[int], NativeDecoder]:
    """Wrap the engine's native decoder; the list collects the rows of each step it served."""
    model = engine.runner.model
    decoder = model.native_decoder
    assert isinstance(decoder, NativeDecoder)
    served: list[int] = []

    def counted(hidden: torch.Tensor, *args: object) -> torch.Tensor | None:
        out = decoder(hidden, *args)
        if out is not None:
            served.append(hidden.shape[0])
        return out

    model.native_decoder = counted
    return served, decoder


def _per_op_outputs(model_dir: Path, dtype: str, quantization: str, requests: dict) -> dict:
    engine = _engine(model_dir, dtype, quantization)
    engine.runner.model.native_decoder = None
    return _outputs(engine, requests)


@pytest.mark.parametrize(("arch", "dtype", "quantization"), [
    ("llama", "bfloat16", "none"),
    ("llama", "float32", "none"),
    ("llama", "bfloat16", "int8"),
    ("qwen2", "bfloat16", "int8"),  # qkv biases, tied embeddings
    ("mistral", "float32", "none"),  # a 21-token sliding window, shorter than most sequences here
    ("llama3", "float32", "int8"),
])
def test_native_layers_equal_per_op_path(tmp_path: Path, arch: str, dtype: str, quantization: str) -> None:
    model_dir = make_tiny_hf_model(arch, tmp_path / arch, seed=11)
    requests = _requests(11)
    native_engine = _engine(model_dir, dtype, quantization)
    served, decoder = _counting(native_engine)
    assert _outputs(native_engine, requests) == _per_op_outputs(model_dir, dtype, quantization, requests)
    assert served, "the native decoder never ran"
    # Steps of more decode rows than its kernels take ran per op; smaller ones natively. With the
    # few-rows kernels (4 or 8 rows) 11 requests start above the limit and end below it; panels
    # (float32 on AVX-512 or AVX2 CPUs: 256 rows; bfloat16 with AVX512-BF16: 64) take every step.
    assert max(served) <= decoder.max_rows and min(served) == 1


def test_gguf_4bit_native_equals_per_op(tmp_path: Path) -> None:
    """GGUF Q4_0 weights kept 4-bit, and Q8_0 ones as their blocks (gguf_linear.py)."""
    requests = _requests(9)
    hf_dir = make_tiny_hf_model("llama", tmp_path / "hf", seed=3)
    for qtype in (gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0):
        path = write_gguf(hf_dir, tmp_path / f"{qtype.name}.gguf", qtype)
        native_engine = _engine(path, "bfloat16", "gguf")
        served, decoder = _counting(native_engine)
        assert _outputs(native_engine, requests) == _per_op_outputs(path, "bfloat16", "gguf", requests)
        assert max(served) == 9 and min(served) == 1
        # From dequantize_min_rows rows on, quantized layers multiply by their dequantized weight, per op;
        # with bfloat16 copies (CPUs with AMX: bf16_copies.py) from COPY_MIN_ROWS.
        if qtype == gguf.GGMLQuantizationType.Q4_0:
            limit = min(ANY_ROWS, dequantize_min_rows(torch.bfloat16, 4) - 1)
        else:
            columns = load_gguf_linear_kernel().columns_fast  # Q8_0 held in column blocks
            limit = min(ANY_ROWS, gguf_dequantize_min_rows(torch.bfloat16, columns) - 1)
        projection = native_engine.runner.model.model.layers[0].mlp.down_proj
        if copy_takes(projection, COPY_MIN_ROWS, torch.bfloat16):  # the copy's panels take rows from there
            copy = projection.__dict__["bf16_copy"]
            limit = copy.panel_rows if copy.panels is not None else min(limit, COPY_MIN_ROWS - 1)
        if isinstance(projection, Int4Linear) and projection.amx_takes(AMX_MIN_ROWS, torch.bfloat16):
            limit = ANY_ROWS  # 4-bit products of many rows on AMX tiles (csrc/int4_amx.c), natively too
        assert decoder.max_rows == limit


def _many_rows_native_equals_per_op(model_dir: Path, quantization: str, dtype: str = "bfloat16",
                                    count: int = 30) -> tuple[list[int], NativeDecoder]:
    """`count` requests (30: up to 32 decoding at once): the native engine's outputs equal the per-op
    engine's; the rows of each step the native decoder served, and the decoder."""
    def engine() -> LLMEngine:
        return LLMEngine(EngineConfig(
            model=ModelConfig(model=str(model_dir), dtype=dtype, quantization=quantization),
            cache=CacheConfig(block_size=8, num_kv_blocks=64 * count),
            scheduler=SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=max(32, count))))

    requests = _requests(count)
    native_engine = engine()
    served, decoder = _counting(native_engine)
    per_op = engine()
    per_op.runner.model.native_decoder = None
    assert _outputs(native_engine, requests) == _outputs(per_op, requests)
    return served, decoder


@pytest.mark.skipif(load_panel_linear_kernel() is None, reason="panels need AVX-512 or AVX2")
def test_float32_panels_take_decode_steps_past_64_rows_natively(tmp_path: Path) -> None:
    """float32 panels take up to FLOAT32_PANEL_ROWS rows (as fast as oneDNN there: cpu/linear.py), so steps
    of 65+ decode rows run in the native call too, with the per-op path's outputs bit for bit."""
    hf_dir = make_tiny_hf_model("llama", tmp_path / "hf", seed=9)
    served, decoder = _many_rows_native_equals_per_op(hf_dir, "none", dtype="float32", count=80)
    assert decoder.max_rows == PackedLinear.FLOAT32_PANEL_ROWS
    assert max(served) > PackedLinear.PANEL_ROWS


@pytest.mark.skipif(load_panel_linear_kernel() is None, reason="panels need AVX-512 or AVX2")
def test_a_bfloat16_checkpoint_run_in_float32_decodes_over_wide_panels(tmp_path: Path) -> None:
    """Its float32 weights are all bfloat16 values, so every projection and the head keep panels of their
    halves (cpu/linear.py); the native layers over them give the per-op path's outputs bit for bit."""
    hf_dir = make_tiny_hf_model("llama", tmp_path / "hf", seed=11)
    bf16_dir = tmp_path / "bf16"
    shutil.copytree(hf_dir, bf16_dir)
    transformers.AutoModelForCausalLM.from_pretrained(hf_dir).to(torch.bfloat16).save_pretrained(bf16_dir)
    kinds = {module.panels.dtype for module in _engine(bf16_dir, "float32").runner.model.modules()
             if type(module) is PackedLinear}
    assert kinds == {torch.int32}
    served, decoder = _many_rows_native_equals_per_op(bf16_dir, "none", dtype="float32", count=40)
    assert decoder.max_rows == PackedLinear.FLOAT32_PANEL_ROWS and max(served) > TILE_ROWS


@pytest.mark.skipif(not _amx_for_4bit(), reason="no AMX on this CPU")
def test_amx_4bit_rows_run_natively(tmp_path: Path) -> None:
    """Decode steps of AMX_MIN_ROWS rows or more: the native layers multiply 4-bit weights on AMX tiles
    (csrc/int4_amx.c, the down projection gated first), as the per-op path does, bit for bit."""
    hf_dir = make_tiny_hf_model("llama", tmp_path / "hf", seed=7)
    model_dir = write_gguf(hf_dir, tmp_path / "q4.gguf", gguf.GGMLQuantizationType.Q4_0)
    served, decoder = _many_rows_native_equals_per_op(model_dir, "gguf")
    assert decoder.max_rows == ANY_ROWS
    assert max(served) >= AMX_MIN_ROWS and min(served) < AMX_MIN_ROWS  # both sides of the AMX limit


@pytest.mark.skipif(copy_panel_kernel() is None, reason="copies keep panels on AVX512-BF16 CPUs without AMX")
@pytest.mark.parametrize(("arch", "quantization"), [("qwen2", "int8"), ("llama", "gguf")])  # qwen2: qkv biases
def test_copy_panels_take_many_rows_natively(tmp_path: Path, arch: str, quantization: str) -> None:
    """Decode steps of COPY_MIN_ROWS rows or more: the native layers multiply by the bfloat16 copies' panels
    (bf16_copies.py), as the per-op path does, bit for bit."""
    hf_dir = make_tiny_hf_model(arch, tmp_path / "hf", seed=5)
    model_dir = write_gguf(hf_dir, tmp_path / "q4.gguf", gguf.GGMLQuantizationType.Q4_0) \
        if quantization == "gguf" else hf_dir
    served, decoder = _many_rows_native_equals_per_op(model_dir, quantization)
    assert decoder.max_rows == PackedLinear.PANEL_ROWS
    assert max(served) >= COPY_MIN_ROWS and min(served) < COPY_MIN_ROWS  # both sides of the copies' limit


@pytest.mark.parametrize("arch", ["qwen3", "gemma2", "gemma3", "gemma4", "mixtral", "olmo2", "granite", "smollm3",
                                  "glm4", "qwen3_moe", "qwen2_moe", "gpt_oss"])
def test_other_layer_forms_keep_per_op_path(tmp_path: Path, arch: str) -> None:
    """q/k norms (Qwen3), Gemma 2's, 3's and 4's layers, mixture-of-experts MLPs, and the families whose layers
    differ from Llama's (post-norms, multipliers, layers without rope, GLM's rope): no native decoder."""
    engine = _engine(make_tiny_hf_model(arch, tmp_path / arch), "bfloat16")
    model = getattr(engine.runner.model, "language_model", engine.runner.model)
    assert getattr(model, "native_decoder", None) is None


def test_lora_wrapped_projections_keep_per_op_path(tmp_path: Path) -> None:
    engine = _engine(make_tiny_hf_model("llama", tmp_path / "llama"), "bfloat16",
                     lora=LoRAConfig(max_loras=2, max_lora_rank=8))
    assert engine.runner.model.native_decoder is None


def test_switch_turns_it_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AQUEDUCT_NATIVE_DECODE", "0")
    engine = _engine(make_tiny_hf_model("llama", tmp_path / "llama"), "bfloat16")
    assert engine.runner.model.native_decoder is None


def test_fp8_cache_keeps_per_op_path(tmp_path: Path) -> None:
    """An fp8 KV cache is written by the quantizing torch path: the native decoder steps aside."""
    engine = LLMEngine(EngineConfig(
        model=ModelConfig(quantization="none", model=str(make_tiny_hf_model("llama", tmp_path / "llama")),
                          dtype="bfloat16"),
        cache=CacheConfig(block_size=8, num_kv_blocks=64, kv_cache_dtype="fp8_e4m3")))
    served, _ = _counting(engine)
    outputs = _outputs(engine, _requests(3))
    assert not served and all(len(tokens) >= 12 for tokens, _ in outputs.values())


def test_the_layers_start_hook_runs_once_per_forward_native_or_per_op(tmp_path: Path) -> None:
    """on_layers_start (the worker's cue to hand the previous step's result over) fires once in every
    forward: just before the native call, or as the per-op path starts (prefills, large batches)."""
    engine = _engine(make_tiny_hf_model("llama", tmp_path / "llama"), "float32", max_num_batched_tokens=512)
    served, decoder = _counting(engine)
    starts: list[int] = []
    decoder.on_layers_start = lambda: starts.append(1)
    _outputs(engine, _requests(16))  # 334 prompt tokens in the first step: more rows than any kernel takes
    assert 0 < len(served) < engine.stats.num_steps  # native steps, and per-op ones (the prefill)
    assert len(starts) == engine.stats.num_steps


def test_a_batch_invariant_engine_keeps_its_panels_for_every_batch_they_take(tmp_path: Path) -> None:
    """With AMX, bfloat16 panels stop at AMX_PANEL_ROWS (oneDNN's AMX product beyond, summing in another
    order); a batch-invariant engine (--batch-invariant, speculative decoding) keeps them to 64 rows."""
    hf_dir = make_tiny_hf_model("llama", tmp_path / "hf", seed=3)
    for invariant in (False, True):
        engine = make_engine(hf_dir, dtype="bfloat16", batch_invariant=invariant)
        panels = [m for m in engine.runner.model.modules() if type(m) is PackedLinear and m.panels is not None]
        if not panels:
            pytest.skip("no bfloat16 panels on this CPU (AVX512-BF16)")
        amx = "amx_bf16" in cpu_flags() and not invariant
        assert {m.panel_rows for m in panels} == {PackedLinear.AMX_PANEL_ROWS if amx else PackedLinear.PANEL_ROWS}
