"""LoRA adapters the engine cannot serve are refused when loaded, with a message naming the problem;
slot assignment (pipeline/lora/slots.py) never evicts an adapter in use."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.config import CacheConfig, EngineConfig, LoRAConfig, ModelConfig
from pipeline.engine import LLMEngine
from pipeline.lora.adapter import LoRAError
from pipeline.lora.slots import LoRASlots
from pipeline.request.sampling_params import SamplingParams
from tests.support.hf_models import make_tiny_hf_model
from tests.support.lora_adapters import make_peft_adapter


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_tiny_hf_model("llama", tmp_path_factory.mktemp("base"), seed=3)


@pytest.fixture(scope="module")
def engine(base):
    return LLMEngine(EngineConfig(model=ModelConfig(quantization="none", dtype="float32", model=str(base)),
                                  cache=CacheConfig(num_kv_blocks=64),
                                  lora=LoRAConfig(max_lora_rank=8)))


def _load(engine, name, path):
    assert engine.lora_registry is not None
    return engine.lora_registry.load(name, path)


@pytest.mark.parametrize(("config", "message"), [
    ({"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "use_dora": True}, "DoRA"),
    ({"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"r": 4, "lora_alpha": 8, "target_modules": ["embed_tokens"]}, "embeddings or lm_head"),
    ({"r": 4, "lora_alpha": 8, "target_modules": ["lm_head"]}, "embeddings or lm_head"),
    ({"r": 16, "lora_alpha": 8, "target_modules": ["q_proj"]}, "rank 16 exceeds --max-lora-rank 8"),
])
def test_unsupported_adapters_are_refused_at_load(engine, base, tmp_path, config, message):
    path = make_peft_adapter(base, tmp_path / "bad", seed=1, **config)
    with pytest.raises(LoRAError, match=message):
        _load(engine, "bad", path)
    assert "bad" not in engine.lora_registry.names()


def test_adapter_for_another_base_model_is_refused(engine, tmp_path):
    other = make_tiny_hf_model("llama", tmp_path / "other", hidden_size=32, intermediate_size=64)
    path = make_peft_adapter(other, tmp_path / "other-lora", seed=1, r=4, lora_alpha=8, target_modules=["q_proj"])
    with pytest.raises(LoRAError, match="another base model"):
        _load(engine, "other", path)


def test_target_the_model_lacks_is_refused(engine, base, tmp_path):
    path = make_peft_adapter(base, tmp_path / "a", seed=1, r=4, lora_alpha=8, target_modules=["q_proj"])
    weights = load_file(path / "adapter_model.safetensors")
    renamed = {key.replace("layers.0.", "layers.7."): value for key, value in weights.items()}
    save_file(renamed, path / "adapter_model.safetensors")
    with pytest.raises(LoRAError, match="layer 7 does not exist"):
        _load(engine, "deep", path)


def test_missing_files_and_bad_config_are_named(engine, base, tmp_path):
    with pytest.raises(LoRAError, match=r"no adapter_config\.json"):
        _load(engine, "nothing", tmp_path)
    path = make_peft_adapter(base, tmp_path / "a", seed=1, r=4, lora_alpha=8, target_modules=["q_proj"])
    config = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**config, "r": 0}))
    with pytest.raises(LoRAError, match="r must be an int >= 1"):
        _load(engine, "zero", path)


def test_unknown_adapter_name_is_a_request_error(engine):
    with pytest.raises(ValueError, match="lora: unknown adapter 'nope'"):
        engine.add_request("x", [5, 6, 7], SamplingParams(max_tokens=2), lora="nope")


def test_lora_on_a_mixture_of_experts_model_is_a_clear_error(tmp_path):
    moe = make_tiny_hf_model("mixtral", tmp_path / "moe")
    with pytest.raises(ValueError, match="LoRA is not supported for mixture-of-experts"):
        LLMEngine(EngineConfig(model=ModelConfig(quantization="none", dtype="float32", model=str(moe)),
                               cache=CacheConfig(num_kv_blocks=16),
                               lora=LoRAConfig()))


def test_slots_evict_the_least_recently_used_idle_adapter_only():
    slots = LoRASlots(2)
    assert slots.acquire(10) == 0 and slots.acquire(11) == 1
    assert slots.take_loads() == {0: 10, 1: 11}
    assert not slots.can_acquire(12)  # both in use
    slots.release(10)
    slots.release(11)
    assert slots.acquire(11) == 1  # resident: no load
    assert slots.can_acquire(12) and slots.acquire(12) == 0  # 10 was idle and least recently used
    assert slots.take_loads() == {0: 12}
    assert slots.resident() == [12, 11] and slots.slot_of(10) is None


def test_requests_wait_for_an_adapter_still_loading_and_fail_if_its_load_fails(engine, base, tmp_path):
    registry = engine.lora_registry
    good = make_peft_adapter(base, tmp_path / "good", seed=2, r=4, lora_alpha=8, target_modules=["q_proj"])
    bad = make_peft_adapter(base, tmp_path / "bad", seed=2, r=4, lora_alpha=8, target_modules=["q_proj"],
                            use_dora=True)
    good_id, bad_id = registry.reserve("late", good), registry.reserve("doomed", bad)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    waiting = engine.add_request("waits", [5, 6, 7, 8], params, lora="late")
    failing = engine.add_request("fails", [5, 6, 7, 8], params, lora="doomed")
    engine.add_request("base", [5, 6, 7, 8], params)
    for _ in range(3):
        engine.step()
    assert waiting.sequences[0].num_computed_tokens == 0 and not waiting.is_finished  # still waiting
    with pytest.raises(LoRAError, match="DoRA"):
        registry.complete(bad_id)
    registry.complete(good_id)
    while engine.has_unfinished:
        engine.step()
    assert waiting.sequences[0].num_output_tokens == 3
    assert failing.sequences[0].finish_reason == "error"
    assert engine.scheduler.take_failures() == [("fails", "lora_unavailable", "lora: adapter 'doomed' failed to load")]


def _corrupt(path, variant: str) -> None:
    weights, config = path / "adapter_model.safetensors", path / "adapter_config.json"
    if variant == "random weights":
        weights.write_bytes(bytes(range(256)) * 8)
    elif variant == "offsets past the end":
        header = json.dumps({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight":
                             {"dtype": "F32", "shape": [4, 64], "data_offsets": [0, 10**9]}}).encode()
        weights.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 64)
    elif variant == "huge header length":
        weights.write_bytes((2**63).to_bytes(8, "little") + b"{}")
    elif variant == "integer tensors":
        save_file({key: value.to(torch.int32) for key, value in load_file(weights).items()}, weights)
    elif variant == "config not UTF-8":
        config.write_bytes(b'{"r": 4, "lora_alpha": "\xff\xfe"}')
    elif variant == "config 100k deep":
        config.write_text('{"r": 4, "lora_alpha": 8, "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif variant == "config too large":
        config.write_text('{"r": 4, "lora_alpha": 8, "x": "' + "a" * (2 << 20) + '"}')


@pytest.mark.parametrize("variant", ["random weights", "offsets past the end", "huge header length",
                                     "integer tensors", "config not UTF-8", "config 100k deep", "config too large"])
def test_corrupt_adapter_files_are_load_errors_never_crashes(engine, base, tmp_path, variant):
    path = make_peft_adapter(base, tmp_path / "a", seed=1, r=4, lora_alpha=8, target_modules=["q_proj"])
    _corrupt(path, variant)
    with pytest.raises(LoRAError, match="lora adapter 'corrupt'"):
        _load(engine, "corrupt", path)
    assert "corrupt" not in engine.lora_registry.names()
