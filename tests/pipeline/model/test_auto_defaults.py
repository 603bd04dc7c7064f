"""The engine's defaults are vLLM's fast path: `dtype: auto` is bfloat16 where the CPU multiplies it natively
(AVX512-BF16 or AMX) and float32 elsewhere, and `quantization: auto` keeps a GGUF file's 4-bit weights on the
CPU. Exactness checks against HF ask for float32 and quantization none explicitly (tests/support)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q

import pipeline.model.loader as loader
from actors.cli.engine_args import engine_config_from_args
from actors.cli.main import build_parser
from pipeline.config import CacheConfig, EngineConfig, ModelConfig
from pipeline.engine import LLMEngine
from pipeline.loading.gguf.quant_blocks import BLOCKS_FILE
from pipeline.model.layers.quantize import auto_quantization
from pipeline.model.layers.quantized_linear import Int4Linear
from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import run_requests
from tests.support.gguf_files import write_gguf
from tests.support.hf_models import make_tiny_hf_model


@pytest.mark.parametrize(("native_bfloat16", "expected"), [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_dtype_on_the_cpu_follows_its_bfloat16_arithmetic(monkeypatch, native_bfloat16, expected) -> None:
    monkeypatch.setattr(loader, "cpu_has_bfloat16_arithmetic", lambda: native_bfloat16)
    assert loader.resolve_dtype("auto", torch.device("cpu")) == expected
    assert loader.resolve_dtype("float32", torch.device("cpu")) == torch.float32


def test_auto_quantization_keeps_gguf_weights_only_where_they_can_run(tmp_path: Path) -> None:
    (tmp_path / BLOCKS_FILE).touch()
    assert auto_quantization(tmp_path, on_cpu=True, tp_world=1, kernels_work=True) == "gguf"
    assert auto_quantization(tmp_path, on_cpu=False, tp_world=1, kernels_work=True) == "none"
    assert auto_quantization(tmp_path, on_cpu=True, tp_world=2, kernels_work=True) == "none"
    assert auto_quantization(tmp_path, on_cpu=True, tp_world=1, kernels_work=False) == "none"
    assert auto_quantization(tmp_path / "missing", on_cpu=True, tp_world=1, kernels_work=True) == "none"


def test_the_command_line_defaults_are_auto_and_tensor_parallel_accepts_them() -> None:
    config = engine_config_from_args(build_parser().parse_args(["batch", "-i", "x", "-o", "y"]))
    assert (config.model.dtype, config.model.quantization) == ("auto", "auto")
    ModelConfig(tensor_parallel_size=2)  # auto resolves to none there: not an error


def test_a_gguf_file_is_served_with_its_4_bit_weights_kept_by_default(tmp_path: Path, monkeypatch,
                                                                      default_model_path: Path) -> None:
    monkeypatch.setenv("AQUEDUCT_CACHE_DIR", str(default_model_path.parent))
    path = write_gguf(make_tiny_hf_model("llama", tmp_path / "hf", seed=5), tmp_path / "m.gguf", Q.Q4_0)
    engine = LLMEngine(EngineConfig(model=ModelConfig(model=str(path)), cache=CacheConfig(num_kv_blocks=64)))
    layers = [module for module in engine.runner.model.modules() if isinstance(module, Int4Linear)]
    assert layers, "quantization auto kept no 4-bit weight"
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    result = run_requests(engine, {"r": ([5, 9, 12], params)})["r"]
    assert len(result["choices"][0]["token_ids"]) == 6
