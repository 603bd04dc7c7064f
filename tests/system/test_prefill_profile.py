"""benchmarks/prefill_profile.py: its hooks must see every linear layer's rows (the GFLOP/s it prints rest
on that count), time the parts inside the step, and leave the model as they found it."""

import importlib.util
import os
from pathlib import Path

import pytest

from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def prefill_profile():
    saved = os.environ.get("OMP_WAIT_POLICY")  # the script sets it on import, as the CLI does
    spec = importlib.util.spec_from_file_location("prefill_profile", BENCHMARKS / "prefill_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if saved is None:
        os.environ.pop("OMP_WAIT_POLICY", None)
    return module


def test_a_prefill_step_counts_every_linear_row_and_times_its_parts(prefill_profile, default_model_path):
    prompts, prompt_len = 3, 100  # 300 rows: past the native decoder's 256, so the step runs layer by layer
    engine = LLMEngine(EngineConfig(
        model=ModelConfig(model=str(default_model_path), dtype="float32"),
        cache=CacheConfig(enable_prefix_caching=False),
        scheduler=SchedulerConfig(max_num_batched_tokens=prompts * prompt_len, max_num_seqs=prompts)))
    model = engine.runner.model
    seconds, timer = prefill_profile.profile_step(engine, prompts, prompt_len, seed=0)

    layers = [module for module in model.modules() if prefill_profile._is_linear(module)]
    assert model.lm_head in layers
    expected = sum(2.0 * prompts * prompt_len * layer.in_features * layer.out_features
                   for layer in layers if layer is not model.lm_head)
    expected += 2.0 * prompts * model.lm_head.in_features * model.lm_head.out_features  # each prompt's last row
    assert timer.linear_flops == expected
    assert {"linear layers", "attention", "RMSNorm"} <= set(timer.seconds)
    assert 0 < sum(timer.seconds.values()) < seconds
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())
    assert "forward_float32" not in vars(model.lm_head)
    backend = model.model.layers[0].self_attn.backend
    assert "forward" not in vars(backend) and "rope_and_write_kv" not in vars(backend)
    assert not engine.has_unfinished


def test_the_float32_peak_is_measured_where_the_cpu_has_fma(prefill_profile):
    peaks = prefill_profile.measure_peaks(threads=1)
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if " fma " not in flags and " avx512f " not in flags:
        pytest.skip("no FMA instructions on this CPU")
    assert peaks["float32 FMA"] > 1.0  # GFLOP/s: any CPU with FMA does far more
    assert (peaks["bfloat16 dot products"] is not None) == (" avx512_bf16 " in flags)
