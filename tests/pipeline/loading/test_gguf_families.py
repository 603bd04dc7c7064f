"""GGUF files of Gemma 3, Qwen3-MoE, gpt-oss, GLM-4, OLMo 2, Granite, SmolLM3, DeepSeek-V2/V3, Qwen2-MoE,
Llama 4 and Gemma 4, written as llama.cpp's converters write them (tests/support/gguf_families.py), serve as
the HF checkpoint they were written from: the same config through HF's own config classes, float32
greedy tokens equal and logprobs within 1e-4, in F32, F16 and a quantized type (against the
checkpoint rounded through that type as the file holds it)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from transformers import AutoConfig, AutoModelForCausalLM

from pipeline.loading.gguf.architectures import gguf_architecture
from pipeline.loading.gguf.hf_config import hf_config
from pipeline.loading.gguf.joins import QWEN2MOE_JOINS, join_tensors
from pipeline.loading.gguf.metadata import GgufMetadata
from pipeline.loading.model_source import resolve_model
from pipeline.model.cpu.gguf_kernel import load_gguf_linear_kernel
from pipeline.model.layers.gguf_linear import GgufLinear
from pipeline.request.sampling_params import SamplingParams
from tests.pipeline.loading.test_gguf import _assert_logprobs_match_hf, _assert_matches_hf, cache_env  # noqa: F401
from tests.support import gguf_families
from tests.support.engine_helpers import make_engine, run_requests
from tests.support.gguf_files import write_gguf, write_rounded_checkpoint
from tests.support.hf_models import make_tiny_hf_model

# (tests/support/hf_models.py arch, overrides): the distinctive parts as hf_models.py switches them on,
# except what a GGUF file cannot say, which is set to what llama.cpp assumes instead: Gemma 3's every
# 6th layer global and a scale from head_dim; Qwen3-MoE's renormalised and Qwen2-MoE's raw top-k
# weights, every layer sparse; gpt-oss's SwiGLU limit 7; SmolLM3's and Llama 4's NoPE every 4th layer;
# Llama 4's chunks of 8192 and temperature tuning (floor 8192, scale 0.1), MoE every interleave step;
# DeepSeek-V3's mscale equal to mscale_all_dim.
FAMILIES = {
    "gemma3": ("gemma3", {"num_hidden_layers": 6, "sliding_window_pattern": 6, "query_pre_attn_scalar": 32,
                          "final_logit_softcapping": 10.0}),
    "gemma4": ("gemma4", {}),
    "qwen3_moe": ("qwen3_moe", {"norm_topk_prob": True, "mlp_only_layers": []}),
    "gpt_oss": ("gpt_oss", {"swiglu_limit": 7.0}),
    "glm4": ("glm4", {}),
    "olmo2": ("olmo2", {}),
    "granite": ("granite", {}),
    "smollm3": ("smollm3", {"no_rope_layer_interval": 4}),
    "deepseek_v2": ("deepseek_v2", {}),
    "deepseek_v3": ("deepseek_v3", {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256,
        "beta_fast": 32, "beta_slow": 1, "mscale": 0.8, "mscale_all_dim": 0.8}}),
    "qwen2_moe": ("qwen2_moe", {"norm_topk_prob": False, "decoder_sparse_step": 1}),
    "llama4": ("llama4", {"no_rope_layer_interval": 4, "attention_chunk_size": 8192, "floor_scale": 8192,
                          "attn_scale": 0.1, "moe_layers": None, "interleave_moe_layer_step": 2}),
}


def _mxfp4_experts(name: str) -> Q:
    """gpt-oss as llama.cpp converts the released checkpoint: experts in MXFP4, the rest as --outtype."""
    return Q.MXFP4 if "_exps." in name or ".experts." in name else Q.F32


# (family, file type, by-name type or None): every family in F32 and F16, and Q8_0, except gpt-oss, whose
# quantized file is the MXFP4 one llama.cpp makes of its released checkpoint.
CASES = {f"{family}-{qtype.name.lower()}": (family, qtype, None) for family in FAMILIES
         for qtype in (Q.F32, Q.F16, Q.Q8_0) if not (family == "gpt_oss" and qtype == Q.Q8_0)}
CASES["gpt_oss-mxfp4"] = ("gpt_oss", Q.MXFP4, _mxfp4_experts)
# HF's config attributes a GGUF file does not carry and the engine does not read.
_NOT_IN_THE_FILE = {"_name_or_path", "transformers_version", "dtype", "torch_dtype", "bos_token_id", "eos_token_id",
                    "pad_token_id", "sliding_window_pattern"}  # Gemma 3's pattern: the file gives layer_types


def _checkpoint(family: str, root: Path) -> Path:
    arch, overrides = FAMILIES[family]
    return make_tiny_hf_model(arch, root / "hf", seed=5, **overrides)


@pytest.fixture(scope="module", params=list(CASES))
def family_case(request, tmp_path_factory, cache_env) -> tuple[str, Path, torch.nn.Module]:  # noqa: F811
    family, qtype, qtype_of = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    hf_dir = _checkpoint(family, root)
    path = write_gguf(hf_dir, root / f"{request.param}.gguf", qtype, qtype_of=qtype_of)
    reference = hf_dir if qtype == Q.F32 else write_rounded_checkpoint(hf_dir, root / "rounded", qtype, qtype_of)
    return request.param, path, AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32).eval()


def test_greedy_tokens_match_the_checkpoint_the_file_came_from(family_case) -> None:
    label, path, hf = family_case
    _assert_matches_hf(make_engine(path), hf, label)


def test_logprobs_match_the_checkpoint_the_file_came_from(family_case) -> None:
    _label, path, hf = family_case
    _assert_logprobs_match_hf(make_engine(path), hf)


def _close(ours, theirs) -> bool:
    """Equal, floats within float32 rounding (the file stores float32), containers element by element."""
    if isinstance(theirs, dict):
        return isinstance(ours, dict) and ours.keys() == theirs.keys() and all(
            _close(ours[key], theirs[key]) for key in theirs)
    if isinstance(theirs, list | tuple):
        return isinstance(ours, list | tuple) and len(ours) == len(theirs) and all(map(_close, ours, theirs))
    if isinstance(theirs, float) and not isinstance(ours, bool):
        return isinstance(ours, int | float) and ours == pytest.approx(theirs, rel=1e-6)
    return ours == theirs


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_converted_config_is_the_checkpoints_config(family, tmp_path, cache_env) -> None:  # noqa: F811
    """Read through transformers' own config class, the config.json made from the file says what the
    checkpoint's says: sizes, layer kinds, ropes, experts, routing, multipliers."""
    hf_dir = _checkpoint(family, tmp_path)
    converted = resolve_model(str(write_gguf(hf_dir, tmp_path / f"{family}.gguf")), torch.float32,
                              tmp_path / "cache").path
    original = AutoConfig.from_pretrained(hf_dir).to_dict()
    ours = AutoConfig.from_pretrained(converted).to_dict()
    differing = {key: (ours.get(key), value) for key, value in original.items()
                 if value is not None and key not in _NOT_IN_THE_FILE and not _close(ours.get(key), value)}
    assert not differing, differing


@pytest.mark.skipif(load_gguf_linear_kernel() is None, reason="no C compiler for the native kernels")
@pytest.mark.parametrize("family", [family for family in FAMILIES if family != "gpt_oss"])
def test_a_q8_0_file_keeps_its_blocks_by_default(family, tmp_path, cache_env) -> None:  # noqa: F811
    """On the CPU a GGUF file's quantized linears keep their blocks (quantization auto -> gguf), in every family."""
    path = write_gguf(_checkpoint(family, tmp_path), tmp_path / f"{family}.gguf", Q.Q8_0)
    engine = make_engine(path, quantization="auto")
    assert any(isinstance(module, GgufLinear) for module in engine.runner.model.modules())
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    assert len(run_requests(engine, {"x": (list(range(5, 30)), params)})["x"]["choices"][0]["token_ids"]) == 4


def test_a_deepseek_file_from_before_the_kv_b_split_serves_alike(tmp_path, cache_env) -> None:  # noqa: F811
    """Files converted before mid-2025 keep attn_kv_b whole and give per-head K/V sizes over all heads."""
    hf_dir = _checkpoint("deepseek_v2", tmp_path)
    path = write_gguf(hf_dir, tmp_path / "deepseek_v2-2024.gguf", family=gguf_families.DEEPSEEK_BEFORE_MLA_SPLIT)
    assert "blk.1.attn_kv_b.weight" in {tensor.name for tensor in gguf.GGUFReader(path).tensors}
    engine = make_engine(path)
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    _assert_matches_hf(engine, hf, "deepseek_v2-2024")
    _assert_logprobs_match_hf(engine, hf)


def test_a_shared_expert_gate_filed_as_a_vector_is_hfs_row() -> None:
    """Qwen2-MoE's [1, H] shared-expert gate, which a converter may squeeze to [H] (llama.cpp reads either)."""
    name = "model.layers.0.mlp.shared_expert_gate.weight"
    joined = join_tensors(QWEN2MOE_JOINS, {name: torch.arange(4.0)}, {})
    assert joined[name].shape == (1, 4) and joined[name].tolist() == [[0.0, 1.0, 2.0, 3.0]]


def test_an_olmo3_file_is_refused_by_name(tmp_path) -> None:
    """OLMo 3 converts as `olmo2` with a window; its HF class is not served."""
    writer = gguf.GGUFWriter(str(tmp_path / "olmo3.gguf"), "olmo2")
    for add, value in [(writer.add_block_count, 4), (writer.add_embedding_length, 64), (writer.add_head_count, 4),
                       (writer.add_context_length, 1024), (writer.add_feed_forward_length, 128),
                       (writer.add_layer_norm_rms_eps, 1e-6), (writer.add_sliding_window, 4096)]:
        add(value)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    metadata = GgufMetadata(gguf.GGUFReader(tmp_path / "olmo3.gguf"))
    with pytest.raises(ValueError, match=r"makes it OLMo 3 \(Olmo3ForCausalLM\), an architecture that is not"):
        hf_config(metadata, gguf_architecture(metadata), {"token_embd.weight"}, None, "float32")
