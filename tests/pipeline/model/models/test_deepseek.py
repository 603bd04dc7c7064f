"""DeepSeek-V2 and DeepSeek-V3 against HF transformers: a KV cache of latents (kv_lora_rank + rope
values per token and layer), the absorbed attention against HF's expanded one, routing against HF's
routers, float32 greedy tokens and logprobs through the engine under chunked prefill, preemption and
prefix caching, each distinctive part shown to be caught, and what is refused by name.

Float32 logits of every kind of runner step are in test_model_forward.py (both families are in its
MODELS), and two tensor-parallel ranks on gloo in tests/system/test_tensor_parallel.py.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM
from transformers.models.deepseek_v2 import modeling_deepseek_v2 as hf_v2
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_v3

from pipeline.config import CacheConfig, ModelConfig, SchedulerConfig
from pipeline.model.attention.latent import LatentPagedAttention
from pipeline.model.attention.selection import make_backend
from pipeline.model.layers.grouped_moe import GroupedMoE, GroupedRouting, grouped_route
from pipeline.model.layers.rope import RotaryEmbedding, parse_rope
from pipeline.model.loader import attention_shape, read_config
from pipeline.model.lora import lora_model_shapes
from pipeline.model.models.deepseek_attention import LatentAttention
from pipeline.model.models.deepseek_config import deepseek_config
from pipeline.model.parallel.sharding import check_tensor_parallel
from pipeline.model.runner import ModelRunner
from pipeline.request.sampling_params import SamplingParams
from tests.pipeline.model.test_model_forward import NUM_BLOCKS, Reference, Seqs, make_runner
from tests.support.engine_helpers import assert_greedy_equal, hf_greedy, make_engine, run_requests
from tests.support.hf_models import make_tiny_hf_model, tiny_config

FAMILIES = ["deepseek_v2", "deepseek_v3"]
LATENT, ROPE, NOPE, V_DIM, HEADS, LAYERS = 32, 16, 40, 24, 4, 3  # tests/support/hf_models.py's sizes


@pytest.fixture(scope="module", params=FAMILIES)
def ref(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    path = make_tiny_hf_model(request.param, tmp_path_factory.mktemp(request.param), seed=11)
    return Reference(path, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())


# arch -> HF's (attention, rotary embedding, router) classes
_HF_PARTS = {"deepseek_v2": (hf_v2.DeepseekV2Attention, hf_v2.DeepseekV2RotaryEmbedding, hf_v2.DeepseekV2TopkRouter),
             "deepseek_v3": (hf_v3.DeepseekV3Attention, hf_v3.DeepseekV3RotaryEmbedding, hf_v3.DeepseekV3TopkRouter)}


def _config(arch: str, **overrides: Any) -> dict[str, Any]:
    """config.json's dict for the tiny `arch` model, with `overrides`."""
    architecture = "DeepseekV3ForCausalLM" if arch == "deepseek_v3" else "DeepseekV2ForCausalLM"
    return {**tiny_config(arch, **overrides).to_dict(), "architectures": [architecture]}


# --- the latent KV cache ----------------------------------------------------------------------------

def test_cache_holds_one_latent_row_per_token_and_layer(ref: Reference) -> None:
    runner = make_runner(ref.path, block_size=16)
    assert type(runner.backend) is LatentPagedAttention
    assert len(runner.kv_caches) == LAYERS
    assert all(cache.shape == (NUM_BLOCKS, 16, 1, LATENT + ROPE) for cache in runner.kv_caches)
    # 16 tokens * (32 latent + 16 rope) float32 values * 3 layers, where per-head K and V would take
    # 16 * 4 heads * ((40 + 16) + 24) * 4 bytes * 3 layers: 6.7x as much.
    assert runner.bytes_per_block == 16 * (LATENT + ROPE) * 4 * LAYERS == 9216


def test_cache_memory_is_divided_into_latent_blocks(ref: Reference) -> None:
    runner = ModelRunner(ModelConfig(quantization="none", dtype="float32", device="cpu"),
                         CacheConfig(block_size=16, kv_cache_memory=2**20), SchedulerConfig(), str(ref.path))
    assert runner.num_kv_blocks == 2**20 // 9216
    assert runner.kv_caches[0].numel() * 4 * LAYERS == runner.num_kv_blocks * runner.bytes_per_block


def test_attention_shape_is_one_latent_head(ref: Reference) -> None:
    config = read_config(ref.path)
    shape = attention_shape(config)
    assert (shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.latent_dim) == (HEADS, 1, LATENT + ROPE, LATENT)
    scale = (NOPE + ROPE) ** -0.5  # qk_head_dim, not the cached row's 48
    if config["architectures"] == ["DeepseekV3ForCausalLM"]:
        scale *= (0.1 * 0.8 * torch.tensor(4.0).log().item() + 1) ** 2  # YaRN's mscale_all_dim 0.8, factor 4
    assert shape.scale == pytest.approx(scale, rel=1e-6)


# --- absorbed attention against HF's expanded attention --------------------------------------------

@pytest.mark.parametrize("arch", FAMILIES)
def test_absorbed_attention_equals_hf_attention_over_chunks(arch: str) -> None:
    """One attention layer, the sequence fed as chunks 7 + 5 + a decode through the latent cache,
    against HF's attention over the whole sequence (expanded per-head K and V, SDPA's causal mask)."""
    config, hf_config = _config(arch), tiny_config(arch)
    hf_config._attn_implementation = "sdpa"
    attention_class, rotary_class, _ = _HF_PARTS[arch]
    generator = torch.Generator().manual_seed(3)
    hf_attention = attention_class(hf_config, layer_idx=0).eval()
    with torch.no_grad():
        for param in hf_attention.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * param.shape[-1] ** -0.5
                        if param.ndim == 2 else 1 + 0.1 * torch.randn(param.shape, generator=generator))
    ours_config = deepseek_config(config, max_positions=64)
    shape = attention_shape(config)
    backend = LatentPagedAttention(HEADS, LATENT + ROPE, LATENT, 4, shape.scale)
    ours = LatentAttention(ours_config, backend).eval()
    ours.load_state_dict(hf_attention.state_dict())
    rotary = RotaryEmbedding(ROPE, 64, parse_rope(config))
    rotary.build("cpu")
    x = torch.randn(1, 13, 64, generator=generator)
    positions = torch.arange(13)[None]
    with torch.no_grad():
        expected = hf_attention(x, attention_mask=None, position_embeddings=rotary_class(hf_config)(x, positions))[0][0]
        cache = torch.zeros(NUM_BLOCKS, 4, 1, LATENT + ROPE)
        seqs = Seqs(4)
        seq = seqs.add(13, max_len=16)
        start = 0
        for chunk in (7, 5, 1):
            inputs = seqs.step([(seq, chunk)])
            cos, sin = rotary.lookup(torch.from_numpy(inputs.positions), torch.float32)
            out = ours(x[0, start:start + chunk], cos, sin, cache, backend.build_metadata(inputs, torch.device("cpu")))
            torch.testing.assert_close(out, expected[start:start + chunk], atol=1e-5, rtol=0)
            start += chunk


# --- routing against HF's routers --------------------------------------------------------------------

@pytest.mark.parametrize(("arch", "overrides"), [
    ("deepseek_v2", {}), ("deepseek_v2", {"topk_method": "greedy"}),
    ("deepseek_v2", {"topk_group": 1, "num_experts_per_tok": 2}), ("deepseek_v3", {}),
    ("deepseek_v3", {"norm_topk_prob": False, "topk_group": 3}),
])
def test_routing_equals_hf_router(arch: str, overrides: dict[str, Any]) -> None:
    config = _config(arch, **overrides)
    router = _HF_PARTS[arch][2](tiny_config(arch, **overrides))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=generator) * 64**-0.5)
        bias = 0.2 * torch.randn(8, generator=generator)
        if arch == "deepseek_v3":
            router.e_score_correction_bias.copy_(bias)
        x = torch.randn(200, 64, generator=generator)
        _, their_weights, their_ids = router(x)
        routing = deepseek_config(config, max_positions=8).routing
        assert routing is not None
        weights, ids = grouped_route(x @ router.weight.T, routing, bias if arch == "deepseek_v3" else None)
    their_order, our_order = their_ids.argsort(dim=-1), ids.argsort(dim=-1)  # HF's top-k is unsorted
    assert torch.equal(ids.gather(1, our_order), their_ids.gather(1, their_order))
    torch.testing.assert_close(weights.gather(1, our_order), their_weights.gather(1, their_order), atol=1e-6, rtol=0)


def test_group_limited_routing_keeps_only_the_best_groups() -> None:
    """The module docstring's example: topk_group 1 keeps group 0, so expert 4 (.25) is not picked."""
    scores = torch.tensor([[.30, .05, .02, .03, .25, .20, .10, .05]])
    grouped = GroupedRouting(8, 2, "group_limited_greedy", "softmax", num_groups=4, topk_group=1)
    weights, ids = grouped_route(scores.log(), grouped)
    assert ids.tolist() == [[0, 1]] and weights[0].tolist() == pytest.approx([.30, .05])
    assert grouped_route(scores.log(), replace(grouped, topk_method="greedy"))[1].tolist() == [[0, 4]]


# --- the engine: greedy tokens and logprobs --------------------------------------------------------

def _workload(seed: int, count: int = 10, max_prompt: int = 60, max_output: int = 16) -> dict[str, Any]:
    rng = random.Random(seed)
    return {f"r{i}": ([rng.randrange(3, 512) for _ in range(rng.randint(1, max_prompt))],
                      SamplingParams(max_tokens=rng.randint(4, max_output), temperature=0.0, ignore_eos=True))
            for i in range(count)}


def _check_greedy(ref: Reference, requests: dict[str, Any], results: dict[str, dict]) -> None:
    for request_id, (prompt, params) in requests.items():
        theirs, logits = hf_greedy(ref.hf, prompt, params.max_tokens)
        assert_greedy_equal(results[request_id]["choices"][0]["token_ids"], theirs, logits, request_id)


def test_greedy_equals_hf_with_chunked_prefill_and_preemption(ref: Reference) -> None:
    requests = _workload(seed=2)
    engine = make_engine(ref.path, block_size=4, num_kv_blocks=40, max_num_batched_tokens=24, max_num_seqs=8)
    results = run_requests(engine, requests)
    assert engine.scheduler.num_preemptions > 0
    _check_greedy(ref, requests, results)
    assert engine.scheduler.kv_cache.num_free_blocks == 40


def test_prefix_cache_hits_give_hf_tokens(ref: Reference) -> None:
    rng = random.Random(3)
    shared = [rng.randrange(3, 512) for _ in range(40)]
    engine = make_engine(ref.path, block_size=8)
    run_requests(engine, {"a": ([*shared, 7, 8], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))})
    second = {f"b{i}": (shared + [rng.randrange(3, 512) for _ in range(i + 1)],
                        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)) for i in range(3)}
    results = run_requests(engine, second)
    assert all(results[r]["usage"].cached_tokens == 40 for r in second)
    _check_greedy(ref, second, results)


def test_logprobs_are_hf_log_softmax(ref: Reference) -> None:
    prompt = list(range(5, 40))
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=3)
    # A budget of 16 tokens splits the prompt over three chunks.
    choice = run_requests(make_engine(ref.path, max_num_batched_tokens=16), {"x": (prompt, params)})["x"]["choices"][0]
    theirs, logits = hf_greedy(ref.hf, prompt, 6)
    expected = torch.log_softmax(logits, dim=-1)
    assert choice["token_ids"] == theirs
    for step, entry in enumerate(choice["logprobs"]):
        assert abs(entry.logprob - float(expected[step, entry.token_id])) < 1e-4
        for token_id, logprob in entry.top:
            assert abs(logprob - float(expected[step, token_id])) < 1e-4


# --- each distinctive part is caught -------------------------------------------------------------

def _moes(runner: ModelRunner) -> list[GroupedMoE]:
    return [layer.mlp for layer in runner.model.model.layers if isinstance(layer.mlp, GroupedMoE)]


def _greedy_routing(runner: ModelRunner) -> None:
    for moe in _moes(runner):
        moe.gate.routing = replace(moe.gate.routing, topk_method="greedy")


def _no_correction_bias(runner: ModelRunner) -> None:
    for moe in _moes(runner):
        moe.gate.e_score_correction_bias = None


def _no_shared_experts(runner: ModelRunner) -> None:
    for moe in _moes(runner):
        moe.shared_experts = None


def _no_routed_scaling(runner: ModelRunner) -> None:
    for moe in _moes(runner):
        moe.gate.routing = replace(moe.gate.routing, routed_scaling_factor=1.0)


def _no_kv_norm(runner: ModelRunner) -> None:
    for layer in runner.model.model.layers:
        layer.self_attn.kv_a_layernorm = nn.Identity()


def _scale_of_the_cached_row(runner: ModelRunner) -> None:
    runner.backend.scale = (LATENT + ROPE) ** -0.5


def _scale_without_mscale(runner: ModelRunner) -> None:
    runner.backend.scale = (NOPE + ROPE) ** -0.5


def _first_layer_sparse(runner: ModelRunner) -> None:
    layers = runner.model.model.layers
    layers[0].mlp = layers[1].mlp


BREAKAGES = {
    "greedy instead of group-limited routing": (_greedy_routing, FAMILIES),
    "no correction bias": (_no_correction_bias, ["deepseek_v3"]),
    "no shared experts": (_no_shared_experts, FAMILIES),
    "no routed scaling factor": (_no_routed_scaling, FAMILIES),
    "no kv_a_layernorm": (_no_kv_norm, FAMILIES),
    "scale from the cached row's width": (_scale_of_the_cached_row, FAMILIES),
    "no YaRN mscale in the scale": (_scale_without_mscale, ["deepseek_v3"]),
    "first layer sparse (first_k_dense_replace ignored)": (_first_layer_sparse, FAMILIES),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_each_distinctive_part_is_caught(ref: Reference, breakage: str) -> None:
    """Intact: HF's logits to 1e-4 over a chunked prefill and decodes; each part broken: off by > 1e-2."""
    break_it, families = BREAKAGES[breakage]
    arch = "deepseek_v3" if read_config(ref.path)["architectures"] == ["DeepseekV3ForCausalLM"] else "deepseek_v2"
    if arch not in families:
        pytest.skip(f"{breakage!r} concerns {' and '.join(families)} only")

    def max_error(runner: ModelRunner) -> float:
        seqs = Seqs(runner.block_size, seed=5)
        seq = seqs.add(40)
        errors = []
        for chunk in (24, 16, 1, 1):
            if seqs.num_computed[seq] == len(seqs.tokens[seq]):
                seqs.append_token(seq)
            logits = runner.execute(seqs.step([(seq, chunk)]))
            errors.append(float((logits - seqs.expected(ref, [(seq, chunk)])).abs().max()))
        return max(errors)

    assert max_error(make_runner(ref.path, block_size=4)) < 1e-4
    broken = make_runner(ref.path, block_size=4)
    break_it(broken)
    assert max_error(broken) > 1e-2


# --- settings and refusals -----------------------------------------------------------------------

@pytest.mark.parametrize(("arch", "overrides", "message"), [
    ("deepseek_v2", {"norm_topk_prob": True}, "DeepSeek-V2 norm_topk_prob must be false"),
    ("deepseek_v2", {"topk_method": "noaux_tc"}, "DeepSeek-V2 topk_method must be one of"),
    ("deepseek_v3", {"topk_method": "greedy"}, "DeepSeek-V3 topk_method must be one of"),
    ("deepseek_v3", {"scoring_func": "softmax"}, "DeepSeek-V3 scoring_func must be 'sigmoid'"),
    ("deepseek_v2", {"moe_layer_freq": 2}, "moe_layer_freq must be 1"),
    ("deepseek_v3", {"hidden_act": "gelu"}, "DeepSeek-V3 hidden_act must be 'silu'"),
    ("deepseek_v2", {"n_group": 3}, r"n_group \(3\) must divide the 8 routed experts"),
])
def test_unserved_settings_are_refused_by_name(arch: str, overrides: dict[str, Any], message: str) -> None:
    config = {**_config(arch), **overrides}
    with pytest.raises(ValueError, match=message):
        deepseek_config(config, max_positions=8)


def test_q_latent_and_dense_layers_follow_the_config() -> None:
    v2, v3 = deepseek_config(_config("deepseek_v2"), 8), deepseek_config(_config("deepseek_v3"), 8)
    assert v2.q_lora_rank is None and v3.q_lora_rank == 48
    assert v2.routing is not None and v2.routing.topk_method == "group_limited_greedy"
    assert v3.routing is not None and v3.routing.topk_method == "noaux_tc" and v3.routing.scoring_func == "sigmoid"
    assert v2.first_k_dense_replace == v3.first_k_dense_replace == 1


def test_lora_fp8_cache_and_cuda_are_refused(ref: Reference) -> None:
    runner = make_runner(ref.path)
    with pytest.raises(ValueError, match="LoRA is not supported for mixture-of-experts models"):
        lora_model_shapes(runner.model)
    config = read_config(ref.path)
    shape = attention_shape(config)
    with pytest.raises(ValueError, match=r"kv_cache_dtype fp8_e4m3 is not supported with multi-head latent"):
        ModelRunner(ModelConfig(quantization="none", dtype="float32", device="cpu"),
                    CacheConfig(num_kv_blocks=4, kv_cache_dtype="fp8_e4m3"), SchedulerConfig(), str(ref.path))
    with pytest.raises(ValueError, match=r"multi-head latent attention .* runs on the CPU only"):
        make_backend("auto", shape, 16, torch.device("cuda"), torch.bfloat16)
    with pytest.raises(ValueError, match="needs attention_backend 'auto' or 'torch', got 'flex'"):
        make_backend("flex", shape, 16, torch.device("cpu"), torch.float32)
    assert getattr(runner.model, "native_decoder", None) is None  # the native decoder serves Llama layers only


def test_tensor_parallel_sizes_are_checked(ref: Reference) -> None:
    """Two ranks split 4 heads and 32-column experts (tests/system/test_tensor_parallel.py runs them);
    the expert width must divide too."""
    config = read_config(ref.path)
    check_tensor_parallel(config, attention_shape(config), 2)
    narrow = {**config, "moe_intermediate_size": 30, "intermediate_size": 128}
    with pytest.raises(ValueError, match=r"tensor_parallel_size 4 must divide the model's moe_intermediate_size"):
        check_tensor_parallel(narrow, attention_shape(narrow), 4)


def test_bfloat16_runs_close_to_hf_bfloat16(ref: Reference) -> None:
    """Not bit for bit: HF keeps the router's weight in float32 and adds the experts' outputs in
    bfloat16. Measured 0.03-0.05 from HF bfloat16 here, where a routing flip puts HF bfloat16 2.2
    from HF float32 on V3's prefill."""
    runner = ModelRunner(ModelConfig(quantization="none", device="cpu", dtype="bfloat16"),
                         CacheConfig(block_size=4, num_kv_blocks=NUM_BLOCKS), SchedulerConfig(), str(ref.path))
    assert runner.kv_caches[0].dtype == torch.bfloat16
    hf_bf16 = Reference(ref.path, AutoModelForCausalLM.from_pretrained(ref.path, dtype=torch.bfloat16).eval())
    seqs = Seqs(runner.block_size)
    seq = seqs.add(12)
    for step, chunks in enumerate([[(seq, 12)], [(seq, 1)]]):
        if step:
            seqs.append_token(seq)
        logits = runner.execute(seqs.step(chunks))
        torch.testing.assert_close(logits, seqs.expected(hf_bf16, chunks), atol=0.125, rtol=0)


def test_multi_token_prediction_layers_are_skipped(ref: Reference, tmp_path: Path) -> None:
    """V3 checkpoints carry a next-token-prediction layer past num_hidden_layers; it serves no step."""
    import shutil

    from safetensors.torch import load_file, save_file

    path = shutil.copytree(ref.path, tmp_path / "m")
    weights = load_file(path / "model.safetensors")
    weights[f"model.layers.{LAYERS}.enorm.weight"] = torch.ones(64)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    runner = make_runner(path)
    seqs = Seqs(runner.block_size)
    seq = seqs.add(9)
    torch.testing.assert_close(runner.execute(seqs.step([(seq, 9)])), seqs.expected(ref, [(seq, 9)]), atol=1e-4,
                               rtol=0)


def test_v3_rope_without_interleave_equals_hf(tmp_path: Path) -> None:
    """rope_interleave false: V3 rotates the halves of q_pe and k_pe (rotate-half), not adjacent pairs."""
    path = make_tiny_hf_model("deepseek_v3", tmp_path / "m", seed=4, rope_interleave=False)
    ref = Reference(path, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())
    runner = make_runner(path, block_size=4)
    assert not runner.model.model.layers[0].self_attn.rope_interleave
    seqs = Seqs(runner.block_size, seed=2)
    seq = seqs.add(30)
    for chunk in (17, 13):
        torch.testing.assert_close(runner.execute(seqs.step([(seq, chunk)])), seqs.expected(ref, [(seq, chunk)]),
                                   atol=1e-4, rtol=0)


# The released checkpoints' config.json (the fields read here; V2-Lite and V3 as on the Hub).
_V2_LITE = {"architectures": ["DeepseekV2ForCausalLM"], "vocab_size": 102400, "hidden_size": 2048,
            "intermediate_size": 10944, "num_hidden_layers": 27, "num_attention_heads": 16,
            "num_key_value_heads": 16, "max_position_embeddings": 163840, "rms_norm_eps": 1e-6,
            "hidden_act": "silu", "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64, "n_shared_experts": 2,
            "num_experts_per_tok": 6, "moe_intermediate_size": 1408, "first_k_dense_replace": 1,
            "moe_layer_freq": 1, "topk_method": "greedy", "n_group": 1, "topk_group": 1, "scoring_func": "softmax",
            "norm_topk_prob": False, "routed_scaling_factor": 1.0, "rope_theta": 10000,
            "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                             "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}}
_V3_FULL = {**_V2_LITE, "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
            "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536,
            "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
            "first_k_dense_replace": 3, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
            "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5,
            "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                             "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}


@pytest.mark.parametrize(("config", "heads", "mscale_all_dim"), [(_V2_LITE, 16, 0.707), (_V3_FULL, 128, 1.0)])
def test_released_configs_give_a_576_value_latent_row(config: dict[str, Any], heads: int,
                                                      mscale_all_dim: float) -> None:
    shape = attention_shape(config)
    assert (shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.latent_dim) == (heads, 1, 576, 512)
    mscale = 0.1 * mscale_all_dim * torch.tensor(40.0).log().item() + 1
    assert shape.scale == pytest.approx(192**-0.5 * mscale**2, rel=1e-6)
    parsed = deepseek_config(config, max_positions=8)
    assert parsed.rope.rope_type == "yarn" and parsed.head_dim == 64  # the rope's width
    # One layer's block of 16 tokens: 16 * 576 values, where V3's 128 heads of expanded K (192) and
    # V (128) would take 16 * 128 * 320, 71x as many.
    assert shape.cache_shape(1, 16) == (1, 16, 1, 576)
