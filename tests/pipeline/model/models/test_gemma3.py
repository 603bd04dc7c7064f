"""Gemma 3 (text) against HF transformers: float32 logits through the paged cache (atol 1e-4) with a
window shorter than the prompts and both layer types at their own rope bases; each distinctive part
(the local rope base, linear scaling of the global one, q/k norms, query_pre_attn_scalar) shown to
be caught; the settings read from either config form against Gemma3TextConfig; a multimodal
checkpoint served text only equal to HF's Gemma3ForConditionalGeneration through the engine
(chunked prefill, preemption, prefix hits, logprobs).

The text checkpoint's greedy tokens and logprobs through the engine are in tests/system/test_fidelity.py
(every tiny model of tests/support/hf_models.py, gemma3 included).
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from pipeline.config import CacheConfig, LoRAConfig, ModelConfig, SchedulerConfig
from pipeline.model.layers.rope import RopeParams, RotaryEmbedding
from pipeline.model.loader import attention_shape, language_config, read_config
from pipeline.model.models.gemma3 import gemma3_config
from pipeline.model.runner import ModelRunner
from pipeline.request.sampling_params import SamplingParams
from tests.pipeline.model.test_model_forward import NUM_BLOCKS, Reference, Seqs, make_runner, run_and_check
from tests.pipeline.model.window_checks import (  # noqa: F401 (a fixture)
    check_across_the_window,
    check_chunks_over_cached_context,
    check_decode_path,
)
from tests.support.engine_helpers import assert_greedy_equal, hf_greedy, make_engine, run_requests
from tests.support.hf_models import make_tiny_hf_model
from tests.support.lora_adapters import make_adapters, peft_model, run_with_adapters

WINDOW = 19  # tests/support/hf_models.py's gemma3 sliding_window
LAYER_WINDOWS = (WINDOW, WINDOW, None, WINDOW)  # its sliding_window_pattern 3
_VISION = {"model_type": "siglip_vision_model", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
           "num_attention_heads": 2, "image_size": 28, "patch_size": 14}


def _reference(path: Path) -> Reference:
    return Reference(path, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return _reference(make_tiny_hf_model("gemma3", tmp_path_factory.mktemp("gemma3"), seed=5))


def make_multimodal(text_path: Path, path: Path, **text_overrides: Any) -> Path:
    """A Gemma3ForConditionalGeneration checkpoint whose language model is `text_path`'s (a tiny
    random SigLIP tower beside it), saved as transformers does (language_model.model.*, vision_tower.*)."""
    text = transformers.Gemma3TextConfig.from_pretrained(text_path)
    for key, value in text_overrides.items():
        setattr(text, key, value)
    config = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=_VISION, mm_tokens_per_image=4)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    causal = AutoModelForCausalLM.from_pretrained(text_path, dtype=torch.float32)
    model.model.language_model.load_state_dict(causal.model.state_dict())
    model.save_pretrained(path)
    transformers.GenerationConfig.from_pretrained(text_path).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def multimodal(gemma: Reference, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    # A final cap in text_config: HF's Gemma3ForConditionalGeneration never applies it, so neither may we.
    return _reference(make_multimodal(gemma.path, tmp_path_factory.mktemp("gemma3_mm"), final_logit_softcapping=3.0))


# --- float32 logits through the paged cache ----------------------------------------------------------

def test_prefill_then_decodes_across_the_window_match_hf(gemma: Reference) -> None:
    check_across_the_window(make_runner(gemma.path, block_size=4), gemma, WINDOW, num_decodes=4)


def test_chunked_prefill_then_decodes_match_hf(gemma: Reference) -> None:
    check_chunks_over_cached_context(make_runner(gemma.path, block_size=4), gemma, num_decodes=3)


# --- each distinctive part is caught -----------------------------------------------------------------

def _local_rope_at_the_global_base(runner: ModelRunner) -> None:
    runner.model.model.rotary_emb_local = runner.model.model.rotary_emb


def _global_rope_unscaled(runner: ModelRunner) -> None:
    table = runner.model.model.rotary_emb
    unscaled = RotaryEmbedding(table.head_dim, table.max_positions, replace(table.params, rope_type="default"))
    unscaled.build("cpu")
    runner.model.model.rotary_emb = unscaled


def _no_qk_norms(runner: ModelRunner) -> None:
    for layer in runner.model.model.layers:
        layer.self_attn.q_norm = layer.self_attn.k_norm = None


def _head_dim_scale(runner: ModelRunner) -> None:
    runner.backend.scale = runner.info.head_dim**-0.5


@pytest.mark.parametrize("switch_off", [_local_rope_at_the_global_base, _global_rope_unscaled, _no_qk_norms,
                                        _head_dim_scale], ids=lambda switch: switch.__name__.strip("_"))
def test_each_distinctive_part_is_caught(gemma: Reference, switch_off: Callable[[ModelRunner], None]) -> None:
    runner = make_runner(gemma.path, block_size=4)
    seqs = Seqs(runner.block_size, seed=8)
    prompts = [seqs.add(45), seqs.add(30)]
    run_and_check(runner, seqs, gemma, [(seq, 20) for seq in prompts])  # intact: equal
    switch_off(runner)
    with pytest.raises(AssertionError):
        run_and_check(runner, seqs, gemma, [(seq, 25) for seq in prompts[:1]] + [(prompts[1], 10)])


def test_the_distinctive_settings_differ_from_what_the_switches_put_back(gemma: Reference) -> None:
    gemma_config = gemma3_config(read_config(gemma.path), max_positions=8)
    assert gemma_config.rope == RopeParams(theta=1e6, rope_type="linear", factor=8.0)
    assert gemma_config.local_rope == RopeParams(theta=1e4)
    assert attention_shape(read_config(gemma.path)).scale == 16**-0.5  # not head_dim (32) ** -0.5


def test_final_logit_cap_applies_where_configured(gemma: Reference, tmp_path: Path) -> None:
    path = make_tiny_hf_model("gemma3", tmp_path / "m", seed=5, final_logit_softcapping=3.0)
    capped = _reference(path)
    runner = make_runner(path, block_size=4)
    seqs = Seqs(runner.block_size, seed=9)
    seq = seqs.add(40)
    run_and_check(runner, seqs, capped, [(seq, 40)])
    assert float(capped.logits(seqs.tokens[seq]).abs().max()) < 3.0 < float(gemma.logits(seqs.tokens[seq]).abs().max())


def test_attention_cap_is_ignored_as_hf_ignores_it(tmp_path: Path) -> None:
    path = make_tiny_hf_model("gemma3", tmp_path / "m", seed=5, attn_logit_softcapping=1.0)
    assert attention_shape(read_config(path)).logit_softcap is None
    runner = make_runner(path, block_size=4)
    seqs = Seqs(runner.block_size, seed=10)
    run_and_check(runner, seqs, _reference(path), [(seqs.add(40), 40)])


# --- settings from config.json -----------------------------------------------------------------------

def test_settings_come_from_config_json(gemma: Reference) -> None:
    shape = attention_shape(read_config(gemma.path))
    assert shape.layer_windows == LAYER_WINDOWS and shape.head_dim == 32 and shape.logit_softcap is None
    assert gemma3_config(read_config(gemma.path), max_positions=1).tie_word_embeddings


_SPARSE: dict[str, Any] = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 8,
                           "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.mark.parametrize("form", [
    {},  # every default
    {"sliding_window_pattern": 3, "rope_theta": 5e5, "rope_local_base_freq": 2e3, "sliding_window": 33,
     "rope_scaling": {"rope_type": "linear", "factor": 4.0}},  # transformers 4
    {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 7e5},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 3e3}},
     "layer_types": ["full_attention", "sliding_attention"] * 4},  # transformers 5
], ids=["defaults", "transformers4", "transformers5"])
def test_settings_are_gemma3_text_configs(form: dict[str, Any]) -> None:
    theirs = transformers.Gemma3TextConfig(**_SPARSE, **form)
    ours = gemma3_config({"architectures": ["Gemma3ForCausalLM"], **_SPARSE, **form}, max_positions=8)
    assert ours.layer_windows == tuple(theirs.sliding_window if kind == "sliding_attention" else None
                                       for kind in theirs.layer_types)
    for params, kind in ((ours.rope, "full_attention"), (ours.local_rope, "sliding_attention")):
        expected = theirs.rope_parameters[kind]
        assert (params.theta, params.rope_type, params.factor) == (
            expected["rope_theta"], expected["rope_type"], expected.get("factor", 1.0))
    assert (ours.vocab_size, ours.head_dim, ours.query_pre_attn_scalar, ours.rms_norm_eps) == (
        theirs.vocab_size, theirs.head_dim, theirs.query_pre_attn_scalar, theirs.rms_norm_eps)
    assert ours.final_logit_softcap == theirs.final_logit_softcapping
    assert ours.tie_word_embeddings == theirs.tie_word_embeddings


def test_multimodal_text_config_as_released_takes_gemma3_text_config_defaults() -> None:
    # google/gemma-3-4b-it's config.json names only these of its language model's settings.
    text = {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text", "num_attention_heads": 8,
            "num_hidden_layers": 34, "num_key_value_heads": 4, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024}
    config = {"architectures": ["Gemma3ForConditionalGeneration"], "text_config": text, "vision_config": {}}
    theirs = transformers.Gemma3TextConfig(**{key: value for key, value in text.items() if key != "model_type"})
    assert language_config(config)["vocab_size"] == theirs.vocab_size == 262_208
    assert language_config(config)["max_position_embeddings"] == theirs.max_position_embeddings
    ours = gemma3_config(config, max_positions=8)
    assert ours.layer_windows.count(None) == theirs.layer_types.count("full_attention") == 5  # every 6th
    assert (ours.rope.theta, ours.rope.factor, ours.local_rope.theta) == (1e6, 8.0, 1e4)
    assert ours.head_dim == 256 and ours.query_pre_attn_scalar == 256


def test_transformers_4_config_form_gives_the_same_logits(gemma: Reference, tmp_path: Path) -> None:
    shutil.copytree(gemma.path, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    del config["layer_types"]
    ropes = config.pop("rope_parameters")
    config.update(rope_theta=ropes["full_attention"]["rope_theta"], rope_scaling={"rope_type": "linear", "factor": 8.0},
                  rope_local_base_freq=ropes["sliding_attention"]["rope_theta"])
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    assert attention_shape(read_config(tmp_path / "m")).layer_windows == LAYER_WINDOWS
    runner = make_runner(tmp_path / "m", block_size=4)
    seqs = Seqs(runner.block_size, seed=7)
    run_and_check(runner, seqs, gemma, [(seqs.add(50), 50)])


@pytest.mark.parametrize(("override", "message"), [
    ({"hidden_activation": "gelu"}, "hidden_activation must be one of"),
    ({"use_bidirectional_attention": True}, "only causal Gemma 3 is served"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, "rope type must be .*got 'dynamic'"),
])
def test_unserved_variants_are_rejected_by_name(override: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gemma3_config({"architectures": ["Gemma3ForCausalLM"], **_SPARSE, **override}, max_positions=1)


# --- numerics that only show in bfloat16 --------------------------------------------------------------

def test_bfloat16_logits_match_hf_bfloat16(gemma: Reference) -> None:
    """Rounding where HF rounds (the q/k norms' Gemma order included): the prefill is HF bfloat16's to
    the last bit or two (bitwise where our packed linear layers and torch's matmul block the same way,
    as on AVX512-BF16 Zen 4; on AMX Xeons they accumulate in another order: 0.016, one ulp at 2).
    Decodes attend over the paged cache in other shapes than HF's SDPA over its cache, and this model's
    peaked attention (q/k norm weights ~1 scale by ~2) amplifies that last-bit difference: measured 0.125
    and 0.07 from HF bfloat16, while HF bfloat16 and float32 differ by 1.47 and 0.42. Allowed: 1/16
    for the prefill, 1/4 for decodes."""
    runner = ModelRunner(ModelConfig(quantization="none", device="cpu", dtype="bfloat16"),
                         CacheConfig(block_size=4, num_kv_blocks=NUM_BLOCKS), SchedulerConfig(), str(gemma.path))
    runner.backend.decode_kernel = None  # the torch path's roundings (see test_gemma2.py)
    hf_bf16 = Reference(gemma.path, AutoModelForCausalLM.from_pretrained(gemma.path, dtype=torch.bfloat16).eval())
    seqs = Seqs(runner.block_size, seed=6)
    seq = seqs.add(30)
    torch.testing.assert_close(runner.execute(seqs.step([(seq, 30)])), seqs.expected(hf_bf16, [(seq, 30)]),
                               atol=1 / 16, rtol=0)
    for _ in range(2):
        seqs.append_token(seq)
        torch.testing.assert_close(runner.execute(seqs.step([(seq, 1)])), seqs.expected(hf_bf16, [(seq, 1)]),
                                   atol=1 / 4, rtol=0)


# --- the multimodal checkpoint, text only ------------------------------------------------------------

def test_multimodal_checkpoint_keeps_its_vision_weights_and_nests_its_text_config(multimodal: Reference) -> None:
    with safe_open(str(multimodal.path / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    assert any(name.startswith("vision_tower.") for name in names)
    assert any(name.startswith("language_model.model.layers.") for name in names)
    config = read_config(multimodal.path)
    assert "hidden_size" not in config and config["text_config"]["final_logit_softcapping"] == 3.0
    assert attention_shape(config).layer_windows == LAYER_WINDOWS
    assert gemma3_config(config, max_positions=1).final_logit_softcap is None  # as HF's head


def test_multimodal_checkpoint_logits_match_hf_text_only(multimodal: Reference) -> None:
    runner = make_runner(multimodal.path, block_size=4)
    assert runner.vision is None  # text prompts only
    seqs = Seqs(runner.block_size, seed=11)
    long_prompt, short = seqs.add(50), seqs.add(9)
    run_and_check(runner, seqs, multimodal, [(long_prompt, 23), (short, 9)])
    seqs.append_token(short)
    run_and_check(runner, seqs, multimodal, [(short, 1), (long_prompt, 27)])


def test_multimodal_checkpoint_in_transformers_5_names_loads(multimodal: Reference, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    shutil.copytree(multimodal.path, tmp_path / "m")
    tensors = load_file(multimodal.path / "model.safetensors")
    renamed = {_transformers_5_name(name): tensor for name, tensor in tensors.items()}
    renamed["lm_head.weight"] = renamed["model.language_model.embed_tokens.weight"].clone()
    save_file(renamed, tmp_path / "m" / "model.safetensors")
    runner = make_runner(tmp_path / "m", block_size=4)
    seqs = Seqs(runner.block_size, seed=12)
    run_and_check(runner, seqs, multimodal, [(seqs.add(40), 40)])


def _transformers_5_name(name: str) -> str:
    """A released multimodal name as transformers 5 holds it in memory:
    language_model.model.x -> model.language_model.x, vision_tower.x -> model.vision_tower.x."""
    if name.startswith("language_model.model."):
        return "model.language_model." + name.removeprefix("language_model.model.")
    return "model." + name


def test_multimodal_unknown_weight_is_an_error(multimodal: Reference, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    shutil.copytree(multimodal.path, tmp_path / "m")
    tensors = load_file(multimodal.path / "model.safetensors")
    tensors["audio_tower.weight"] = torch.zeros(2)
    save_file(tensors, tmp_path / "m" / "model.safetensors")
    with pytest.raises(ValueError, match=r"unexpected weight in checkpoint: audio_tower\.weight"):
        make_runner(tmp_path / "m", block_size=4)


def _workload(seed: int, count: int, max_prompt: int = 80) -> dict[str, tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    return {f"r{index}": ([rng.randrange(3, 512) for _ in range(rng.randint(1, max_prompt))],
                          SamplingParams(max_tokens=rng.randint(4, 16), temperature=0.0, ignore_eos=True))
            for index in range(count)}


def test_multimodal_greedy_tokens_match_hf_under_preemption_and_chunked_prefill(multimodal: Reference) -> None:
    requests = _workload(seed=2, count=10)
    engine = make_engine(multimodal.path, block_size=4, num_kv_blocks=40, max_num_batched_tokens=24, max_num_seqs=8)
    results = run_requests(engine, requests)
    assert engine.scheduler.num_preemptions > 0
    for request_id, (prompt, params) in requests.items():
        theirs, logits = hf_greedy(multimodal.hf, prompt, params.max_tokens)
        assert_greedy_equal(results[request_id]["choices"][0]["token_ids"], theirs, logits, request_id)


def test_multimodal_prefix_hits_and_logprobs_match_hf(multimodal: Reference) -> None:
    rng = random.Random(3)
    shared = [rng.randrange(3, 512) for _ in range(40)]
    engine = make_engine(multimodal.path, block_size=8)
    run_requests(engine, {"a": ([*shared, 7, 8], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))})
    prompt = [*shared, 9, 10, 11]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=3)
    result = run_requests(engine, {"b": (prompt, params)})["b"]
    assert result["usage"].cached_tokens == 40
    theirs, logits = hf_greedy(multimodal.hf, prompt, 6)
    choice = result["choices"][0]
    assert choice["token_ids"] == theirs
    expected = torch.log_softmax(logits, dim=-1)
    for step, entry in enumerate(choice["logprobs"]):
        assert abs(entry.logprob - float(expected[step, entry.token_id])) < 1e-4
        for token_id, logprob in entry.top:
            assert abs(logprob - float(expected[step, token_id])) < 1e-4


# --- LoRA ---------------------------------------------------------------------------------------------

def test_adapter_on_every_projection_matches_peft(gemma: Reference, tmp_path: Path) -> None:
    adapters = make_adapters(gemma.path, tmp_path, ["all16rs"])
    engine = make_engine(gemma.path, block_size=4, num_kv_blocks=128, max_num_batched_tokens=16,
                         lora=LoRAConfig(modules=(("all16rs", str(adapters["all16rs"])),), max_loras=1,
                                         max_lora_rank=16))
    rng = random.Random(3)
    requests = {f"r{index}": ([rng.randrange(3, 512) for _ in range(rng.randint(5, 30))],
                              SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True), lora)
                for index, lora in enumerate(["all16rs", None, "all16rs"])}
    results = run_with_adapters(engine, requests)
    models = {None: gemma.hf, "all16rs": peft_model(gemma.path, adapters["all16rs"])}
    changed = False
    for request_id, (prompt, params, lora) in requests.items():
        theirs, logits = hf_greedy(models[lora], prompt, params.max_tokens)
        assert_greedy_equal(results[request_id]["tokens"], theirs, logits, f"{request_id}/{lora}")
        changed |= lora is not None and theirs != hf_greedy(gemma.hf, prompt, params.max_tokens)[0]
    assert changed  # the adapter changes the tokens: the check above can fail
