"""Tensor parallelism (--tensor-parallel-size) with 2 ranks on CPU (gloo): greedy tokens equal to
TP = 1 and to HF transformers for the tiny model of each family, with chunked prefill, preemption
and prefix hits; the packed step broadcast; clear errors; rank and driver failures end cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.parallel.group import backend_for, check_world, pack, rank_device, unpack
from pipeline.model.parallel.sharding import LocalHeads, local_heads
from pipeline.request.sampling_params import SamplingParams
from pipeline.step.inputs import StepInputs
from tests.support.engine_helpers import assert_greedy_equal, hf_greedy, run_requests
from tests.support.hf_models import make_tiny_hf_model


def _engine(path: Path, tp: int, num_kv_blocks: int = 24, budget: int = 24, **model: object) -> LLMEngine:
    return LLMEngine(EngineConfig(model=ModelConfig(model=str(path), tensor_parallel_size=tp,
                                                    **{"dtype": "float32", **model}),
                                  cache=CacheConfig(block_size=4, num_kv_blocks=num_kv_blocks),
                                  scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=6)))


def _requests(seed: int) -> dict[str, tuple[list[int], SamplingParams]]:
    rng = np.random.default_rng(seed)
    shared = rng.integers(3, 512, size=12).tolist()
    prompts = [shared + rng.integers(3, 512, size=int(n)).tolist() for n in rng.integers(1, 50, size=6)]
    return {f"r{i}": (prompt, SamplingParams(max_tokens=int(rng.integers(4, 16)), temperature=0.0, ignore_eos=True))
            for i, prompt in enumerate(prompts)}


@pytest.mark.parametrize(("arch", "overrides"), [("llama", {}), ("qwen2", {}), ("qwen3", {}), ("mistral", {}),
                                                 ("gemma2", {}), ("gemma3", {}), ("phi3", {}), ("granite", {}),
                                                 ("smollm3", {}), ("glm4", {}),
                                                 # latent attention and grouped experts (latent_sharding.py)
                                                 ("deepseek_v2", {}), ("deepseek_v3", {}),
                                                 # one KV head: replicated on both ranks
                                                 ("llama", {"num_key_value_heads": 1})])
def test_two_ranks_match_one_rank_and_hf(tmp_path, arch: str, overrides: dict) -> None:
    path = make_tiny_hf_model(arch, tmp_path / arch, **overrides)
    requests = _requests(seed=len(arch))
    parallel = _engine(path, tp=2)
    try:
        results = run_requests(parallel, requests)
        assert parallel.scheduler.num_preemptions > 0  # 24 blocks of 4 tokens cannot hold all six
        assert any(result["usage"].cached_tokens > 0 for result in results.values())
    finally:
        parallel.runner.close()
    single = run_requests(_engine(path, tp=1), requests)
    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    for request_id, (prompt, params) in requests.items():
        ours = results[request_id]["choices"][0]["token_ids"]
        theirs, logits = hf_greedy(hf, prompt, params.max_tokens)
        assert_greedy_equal(ours, theirs, logits, f"{arch} {request_id} vs HF")
        assert_greedy_equal(ours, single[request_id]["choices"][0]["token_ids"], logits, f"{arch} {request_id} vs TP=1")


def test_step_inputs_cross_as_one_packed_buffer() -> None:
    inputs = StepInputs(input_ids=np.array([5, 6, 7], dtype=np.int64), positions=np.array([0, 1, 9], dtype=np.int64),
                        slot_mapping=np.array([4, 5, -1], dtype=np.int64),
                        query_start_loc=np.array([0, 2, 3], dtype=np.int32), seq_lens=np.array([2, 10], dtype=np.int32),
                        block_tables=np.array([[1, 0, 0], [3, 4, 7]], dtype=np.int32),
                        logits_indices=np.array([1, 2], dtype=np.int64), num_tokens=3, max_query_len=2, max_seq_len=10)
    header, payload = pack(inputs)
    assert payload.dtype == torch.int64 and payload.ndim == 1
    back = unpack(header, payload)
    for name in ("input_ids", "positions", "slot_mapping", "query_start_loc", "seq_lens", "block_tables",
                 "logits_indices"):
        np.testing.assert_array_equal(getattr(back, name), getattr(inputs, name))
        assert getattr(back, name).dtype == getattr(inputs, name).dtype, name
    assert (back.num_tokens, back.max_query_len, back.max_seq_len) == (3, 2, 10)


def test_heads_per_rank() -> None:
    """The worked example of parallel.py: 8 query heads, 2 KV heads."""
    shape = AttentionShape(num_layers=1, num_heads=8, num_kv_heads=2, head_dim=16, scale=0.25,
                           layer_windows=(None,))
    assert local_heads(shape, 3, 4) == LocalHeads(num_heads=2, q_start=6, num_kv_heads=1, kv_start=1)
    assert local_heads(shape, 1, 4) == LocalHeads(num_heads=2, q_start=2, num_kv_heads=1, kv_start=0)
    assert local_heads(shape, 1, 2) == LocalHeads(num_heads=4, q_start=4, num_kv_heads=1, kv_start=1)


def test_bad_sizes_are_clear_errors(tmp_path, monkeypatch) -> None:
    path = make_tiny_hf_model("llama", tmp_path / "llama")  # 4 heads, 2 KV heads
    with pytest.raises(ValueError, match="tensor_parallel_size 3 must divide the model's 4 attention heads"):
        _engine(path, tp=3)
    with monkeypatch.context() as patch:
        patch.setattr(os, "cpu_count", lambda: 1)
        with pytest.raises(ValueError, match="tensor_parallel_size 2 exceeds the 1 CPU cores"):
            _engine(path, tp=2)
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1"):
        ModelConfig(quantization="none", dtype="float32", tensor_parallel_size=0)
    mixtral = make_tiny_hf_model("mixtral", tmp_path / "mixtral")
    with pytest.raises(ValueError, match="does not support mixture-of-experts models yet"):
        _engine(mixtral, tp=2)


def test_cuda_ranks_take_nccl_and_one_device_each(monkeypatch) -> None:
    assert backend_for(torch.device("cpu")) == "gloo" and backend_for(torch.device("cuda")) == "nccl"
    assert [rank_device(torch.device("cuda:1"), rank) for rank in range(3)] == [
        torch.device("cuda", 1), torch.device("cuda", 2), torch.device("cuda", 3)]
    assert rank_device(torch.device("cpu"), 1) == torch.device("cpu")
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_world(2, torch.device("cuda"))
    with pytest.raises(ValueError, match="tensor_parallel_size 2 from cuda:1 needs 3 CUDA devices; this machine has 2"):
        check_world(2, torch.device("cuda:1"))
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    with pytest.raises(ValueError, match="needs NCCL"):
        check_world(2, torch.device("cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_two_nccl_ranks_match_one_rank_on_cuda(tmp_path) -> None:
    path = make_tiny_hf_model("llama", tmp_path / "llama")
    requests = _requests(seed=5)
    parallel = _engine(path, tp=2, device="cuda", dtype="float32")
    try:
        results = run_requests(parallel, requests)
    finally:
        parallel.runner.close()
    single = run_requests(_engine(path, tp=1, device="cuda", dtype="float32"), requests)
    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    for request_id, (prompt, params) in requests.items():
        ours = results[request_id]["choices"][0]["token_ids"]
        theirs, logits = hf_greedy(hf, prompt, params.max_tokens)  # near-ties may flip under a new sum order
        assert_greedy_equal(ours, theirs, logits, f"NCCL {request_id} vs HF")
        assert_greedy_equal(ours, single[request_id]["choices"][0]["token_ids"], logits, f"NCCL {request_id} vs TP=1")


# The markers go out in one write each, after whatever the process had buffered: the ranks' log
# lines share the pipe, and a marker split over two writes once had a log line land inside it.
_SERVE_FOREVER = textwrap.dedent("""
    import os, sys, time
    from pipeline.config import CacheConfig, EngineConfig, ModelConfig
    from pipeline.engine import LLMEngine
    from pipeline.request.sampling_params import SamplingParams

    if __name__ == "__main__":
        engine = LLMEngine(EngineConfig(model=ModelConfig(quantization="none", dtype="float32", model=sys.argv[1],
                                                          tensor_parallel_size=2),
                                        cache=CacheConfig(num_kv_blocks=64)))
        sys.stdout.flush()
        os.write(1, f"RANK {engine.runner.tp_group.processes[0].pid}\\n".encode())
        for index in range(10**6):
            engine.add_request(f"r{index}", [5, 6, 7], SamplingParams(max_tokens=8, ignore_eos=True))
            while engine.has_unfinished:
                engine.step()
            if sys.argv[2] == "close" and index == 2:
                engine.runner.close()
                sys.stdout.flush()
                os.write(1, b"CLOSED\\n")
                time.sleep(60)
""")


def _start_driver(tmp_path: Path, model: Path, mode: str) -> tuple[subprocess.Popen, int]:
    script = tmp_path / "serve.py"
    script.write_text(_SERVE_FOREVER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    driver = subprocess.Popen([sys.executable, str(script), str(model), mode], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env=env)
    for line in driver.stdout:
        marker = re.search(r"RANK (\d+)", line)
        if marker:
            return driver, int(marker.group(1))
    raise AssertionError(f"driver ended before its ranks started (exit {driver.wait()})")


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_killing_a_rank_ends_the_driver_with_exit_1(tmp_path) -> None:
    driver, rank_pid = _start_driver(tmp_path, make_tiny_hf_model("llama", tmp_path / "llama"), "serve")
    try:
        os.kill(rank_pid, signal.SIGKILL)
        assert driver.wait(timeout=60) == 1
    finally:
        driver.kill()


def test_ranks_exit_when_the_driver_dies_or_closes(tmp_path) -> None:
    model = make_tiny_hf_model("llama", tmp_path / "llama")
    driver, rank_pid = _start_driver(tmp_path, model, "serve")
    driver.kill()
    driver.wait()
    assert _gone(rank_pid, 30), "rank still running after its driver was killed"
    driver, rank_pid = _start_driver(tmp_path, model, "close")
    try:
        assert any("CLOSED" in line for line in driver.stdout)
        assert _gone(rank_pid, 30), "rank still running after the driver closed the group"
    finally:
        driver.kill()


def test_flag_reaches_the_config() -> None:
    import argparse

    from actors.cli.engine_args import add_engine_args, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--tensor-parallel-size", "2", "--model", "builtin"])
    assert engine_config_from_args(args).model.tensor_parallel_size == 2
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1"):
        engine_config_from_args(parser.parse_args(["--tensor-parallel-size", "0", "--model", "builtin"]))
