"""GGUF files: converted once into the cache, then served like any HF directory, token for token
with HF transformers reading the same file."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from transformers import AutoModelForCausalLM, AutoTokenizer

import pipeline.loading.gguf.convert as convert
import pipeline.loading.gguf.file_hash as file_hash
from pipeline.loading.gguf import gguf_model_dir
from pipeline.loading.gguf.architectures import gguf_architecture
from pipeline.loading.gguf.hf_config import hf_config
from pipeline.loading.gguf.metadata import GgufMetadata
from pipeline.loading.model_source import resolve_model
from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import assert_greedy_equal, hf_greedy, make_engine, run_requests
from tests.support.gguf_files import hf_model_from_gguf, write_gguf, write_minimal_gguf, write_rounded_checkpoint
from tests.support.gguf_tokenizers import BOS_TOKEN_ID
from tests.support.hf_models import EOS_TOKEN_ID, make_tiny_hf_model

# Gemma 2 as transformers' GGUF loader reads it: it ignores the soft caps and assumes Gemma2Config's
# query_pre_attn_scalar (256); a head size of 256 makes that llama.cpp's value too.
_GEMMA2_AS_HF_READS = {"head_dim": 256, "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0,
                       "final_logit_softcapping": 30.0}
# (tests/support/hf_models.py arch, GGUF type, config overrides). qwen3 with head size 128, the real models':
# transformers' GGUF loader does not read attention.key_length and assumes Qwen3Config's 128; it
# ignores Phi-3's window. (What it drops is tested below against the original checkpoint.)
CASES = {
    "llama-f32": ("llama", Q.F32, {}),
    "llama-f16": ("llama", Q.F16, {}),
    "llama-q8_0": ("llama", Q.Q8_0, {}),
    "llama-q4_0": ("llama", Q.Q4_0, {}),
    "qwen2-q8_0": ("qwen2", Q.Q8_0, {}),
    "qwen3-q4_0": ("qwen3", Q.Q4_0, {"head_dim": 128}),
    "gemma2-f32": ("gemma2", Q.F32, _GEMMA2_AS_HF_READS),
    "gemma2-q8_0": ("gemma2", Q.Q8_0, _GEMMA2_AS_HF_READS),
    "phi3-f32": ("phi3", Q.F32, {"sliding_window": None}),
    "phi3-q8_0": ("phi3", Q.Q8_0, {"sliding_window": None}),
    "mixtral-f32": ("mixtral", Q.F32, {}),
    "mixtral-q8_0": ("mixtral", Q.Q8_0, {}),
}
# transformers' GGUF loader reads a Mixtral file (general.architecture `llama`) as Llama and finds no
# MLP; the reference is then the checkpoint the file was written from, rounded through the file's type.
_HF_CANNOT_READ = {"mixtral"}


@pytest.fixture(scope="module")
def cache_env(default_model_path: Path) -> Iterator[Path]:
    """The session's cache (built-in model, compiled kernel) as $AQUEDUCT_CACHE_DIR for this module."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AQUEDUCT_CACHE_DIR", str(default_model_path.parent))
        yield default_model_path.parent


@pytest.fixture(scope="module", params=list(CASES))
def gguf_case(request, tmp_path_factory, cache_env) -> tuple[str, Path, torch.nn.Module]:
    arch, qtype, overrides = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    hf_dir = make_tiny_hf_model(arch, root / "hf", seed=5, **overrides)
    path = write_gguf(hf_dir, root / f"{request.param}.gguf", qtype)
    if arch not in _HF_CANNOT_READ:
        return request.param, path, hf_model_from_gguf(path)
    rounded = write_rounded_checkpoint(hf_dir, root / "rounded", qtype)
    return request.param, path, AutoModelForCausalLM.from_pretrained(rounded, dtype=torch.float32).eval()


def _greedy_workload(seed: int, count: int = 6) -> dict[str, tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    return {f"r{i}": ([rng.randrange(3, 512) for _ in range(rng.randint(1, 40))],
                      SamplingParams(max_tokens=rng.randint(4, 12), temperature=0.0, ignore_eos=True))
            for i in range(count)}


def _assert_matches_hf(engine, hf: torch.nn.Module, label: str) -> None:
    requests = _greedy_workload(seed=7)
    results = run_requests(engine, requests)
    for request_id, (prompt, params) in requests.items():
        theirs, logits = hf_greedy(hf, prompt, params.max_tokens)
        assert_greedy_equal(results[request_id]["choices"][0]["token_ids"], theirs, logits, f"{label}/{request_id}")


def test_greedy_tokens_match_hf_reading_the_same_gguf(gguf_case) -> None:
    label, path, hf = gguf_case
    _assert_matches_hf(make_engine(path), hf, label)


def test_logprobs_match_hf_reading_the_same_gguf(gguf_case) -> None:
    _label, path, hf = gguf_case
    _assert_logprobs_match_hf(make_engine(path), hf)


def _assert_logprobs_match_hf(engine, hf: torch.nn.Module) -> None:
    prompt = list(range(5, 30))
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=2)
    choice = run_requests(engine, {"x": (prompt, params)})["x"]["choices"][0]
    theirs, logits = hf_greedy(hf, prompt, 4)
    expected = torch.log_softmax(logits, dim=-1)
    assert choice["token_ids"] == theirs
    for step, entry in enumerate(choice["logprobs"]):
        assert entry.logprob == pytest.approx(float(expected[step, entry.token_id]), abs=1e-4)


@pytest.mark.parametrize("arch,overrides", [("llama3", {}), ("qwen3", {"head_dim": 32})],
                         ids=["llama3-rope_freqs", "qwen3-key_length"])
def test_a_lossless_gguf_serves_like_the_checkpoint_it_came_from(arch, overrides, tmp_path, cache_env) -> None:
    """What transformers' GGUF loader drops (llama3 rope scaling, stored as rope_freqs; a head size
    other than hidden / heads) is kept: an F32 file gives the original model's tokens."""
    hf_dir = make_tiny_hf_model(arch, tmp_path / "hf", seed=9, **overrides)
    path = write_gguf(hf_dir, tmp_path / f"{arch}.gguf", Q.F32)
    engine = make_engine(path)
    original = json.loads((hf_dir / "config.json").read_text())
    converted = json.loads((engine.model_dir / "config.json").read_text())
    assert converted["head_dim"] == (overrides.get("head_dim") or 16)
    if arch == "llama3":
        expected = {k: v for k, v in (original.get("rope_parameters") or original["rope_scaling"]).items()
                    if k != "rope_theta"}
        assert converted["rope_scaling"] == expected
    _assert_matches_hf(engine, AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval(), arch)


# (arch, config overrides, write_gguf options): what transformers' GGUF loader cannot check.
FAMILY_CASES = {
    # Soft caps that bite, both layer kinds and a window shorter than the prompts (tests/support/hf_models.py);
    # query_pre_attn_scalar = head_dim, the only value a llama.cpp file expresses below 46 layers.
    "gemma2-caps-window": ("gemma2", {"query_pre_attn_scalar": 32}, {}),
    "phi3-window": ("phi3", {}, {}),
    "mistral-recorded-window": ("mistral", {}, {"record_sliding_window": True}),
}
_FAMILY_FIELDS = ("architectures", "sliding_window", "query_pre_attn_scalar", "attn_logit_softcapping",
                  "final_logit_softcapping", "num_local_experts", "num_experts_per_tok")


@pytest.mark.parametrize("case", list(FAMILY_CASES))
def test_a_lossless_family_gguf_serves_like_the_checkpoint_it_came_from(case, tmp_path, cache_env) -> None:
    arch, overrides, options = FAMILY_CASES[case]
    hf_dir = make_tiny_hf_model(arch, tmp_path / "hf", seed=9, **overrides)
    engine = make_engine(write_gguf(hf_dir, tmp_path / f"{arch}.gguf", Q.F32, **options))
    original = json.loads((hf_dir / "config.json").read_text())
    converted = json.loads((engine.model_dir / "config.json").read_text())
    assert {field: converted.get(field) for field in _FAMILY_FIELDS} == {
        field: original.get(field) for field in _FAMILY_FIELDS}
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    _assert_matches_hf(engine, hf, case)
    _assert_logprobs_match_hf(engine, hf)


def test_a_mistral_file_without_a_recorded_window_is_served_as_llama_cpp_serves_it(tmp_path) -> None:
    """convert_hf_to_gguf.py records no window for Mistral (7B v0.1's 4096 is dropped); llama.cpp
    then attends to everything, and so does the converted model."""
    hf_dir = make_tiny_hf_model("mistral", tmp_path / "hf", seed=3)
    converted = gguf_model_dir(write_gguf(hf_dir, tmp_path / "mistral.gguf"), torch.float32, tmp_path / "cache")
    config = json.loads((converted / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "sliding_window" not in config


@pytest.mark.parametrize("layers,hidden,heads,head_dim,expected", [(42, 3584, 16, 256, 256), (46, 4608, 32, 128, 144)],
                         ids=["gemma-2-9b", "gemma-2-27b"])
def test_gemma2_attention_scale_is_the_one_llama_cpp_assumes(layers, hidden, heads, head_dim, expected, tmp_path):
    """GGUF stores no query_pre_attn_scalar; llama.cpp uses head_dim, except at 46 layers (27B)."""
    writer = gguf.GGUFWriter(str(tmp_path / "gemma2.gguf"), "gemma2")
    for add, value in [(writer.add_block_count, layers), (writer.add_embedding_length, hidden),
                       (writer.add_head_count, heads), (writer.add_key_length, head_dim),
                       (writer.add_value_length, head_dim), (writer.add_context_length, 8192),
                       (writer.add_feed_forward_length, 4 * hidden), (writer.add_layer_norm_rms_eps, 1e-6)]:
        add(value)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    metadata = GgufMetadata(gguf.GGUFReader(tmp_path / "gemma2.gguf"))
    config = hf_config(metadata, gguf_architecture(metadata), {"token_embd.weight"}, None, "float32")
    assert (config["query_pre_attn_scalar"], config["head_dim"]) == (expected, head_dim)
    assert (config["attn_logit_softcapping"], config["final_logit_softcapping"]) == (50.0, 30.0)  # llama.cpp's


def test_a_longrope_phi3_file_is_a_clear_error(tmp_path) -> None:
    hf_dir = make_tiny_hf_model("phi3", tmp_path / "hf", original_max_position_embeddings=256, rope_scaling={
        "rope_type": "longrope", "long_factor": [1.0 + i for i in range(8)], "short_factor": [1.0] * 8})
    path = write_gguf(hf_dir, tmp_path / "phi3-128k.gguf")
    with pytest.raises(ValueError, match=r"LongRoPE scaling \(rope_factors_long/short tensors\), which is not"):
        resolve_model(str(path), torch.float32, tmp_path / "cache")


@pytest.fixture
def small_gguf(tmp_path: Path) -> Path:
    hf_dir = make_tiny_hf_model("llama", tmp_path / "hf", seed=1)
    return write_gguf(hf_dir, tmp_path / "model" / "tiny.gguf", Q.Q8_0)


def test_a_second_load_reuses_the_conversion_without_hashing_the_file_again(small_gguf, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = gguf_model_dir(small_gguf, torch.float32, cache)

    def fail(*_args):
        raise AssertionError("converted or hashed again")

    monkeypatch.setattr(convert, "write_hf_directory", fail)
    monkeypatch.setattr(file_hash, "_hash_bytes", fail)
    assert gguf_model_dir(small_gguf, torch.float32, cache) == first
    assert resolve_model(str(small_gguf.parent), torch.float32, cache).path == first  # the directory form


def test_a_touched_file_is_hashed_again_but_not_converted_again(small_gguf, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = gguf_model_dir(small_gguf, torch.float32, cache)
    os.utime(small_gguf, ns=(1, 1))
    monkeypatch.setattr(convert, "write_hf_directory", lambda *_args: pytest.fail("converted again"))
    assert gguf_model_dir(small_gguf, torch.float32, cache) == first


def test_each_dtype_gets_its_own_conversion(small_gguf, tmp_path):
    cache = tmp_path / "cache"
    as_float32 = gguf_model_dir(small_gguf, torch.float32, cache)
    as_bfloat16 = gguf_model_dir(small_gguf, torch.bfloat16, cache)
    assert as_float32 != as_bfloat16
    assert json.loads((as_bfloat16 / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert sorted(p.name for p in (cache / "gguf").iterdir() if not p.name.startswith("hashes")) == sorted(
        [as_float32.name, as_bfloat16.name])  # no staging directory left behind


def test_an_unsupported_architecture_is_a_clear_error(tmp_path):
    path = write_minimal_gguf(tmp_path / "other.gguf", "gpt2")
    with pytest.raises(ValueError, match=r"GGUF architecture 'gpt2' is not supported; "
                                         r"supported GGUF architectures: llama, qwen2, qwen3, gemma2, phi3"):
        resolve_model(str(path), torch.float32, tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache" / "gguf").iterdir()] == ["hashes"]  # nothing half-converted


def test_chat_prompts_get_the_templates_bos_once_and_text_prompts_get_it_added(small_gguf, cache_env):
    """The file's tokenizer adds BOS and its template writes BOS itself, as Llama 3's does."""
    engine = make_engine(small_gguf)
    hf_tokenizer = AutoTokenizer.from_pretrained(str(small_gguf.parent), gguf_file=small_gguf.name)
    messages = [{"role": "user", "content": "The river carried"}]
    chat = engine.builder.build("c", SamplingParams(), messages=messages)
    expected = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert chat.prompt_token_ids == list(expected)
    assert chat.prompt_token_ids[:2] == [BOS_TOKEN_ID, 1]  # <|endoftext|> <|im_start|>, no second BOS
    text = engine.builder.build("t", SamplingParams(), prompt="The river carried")
    assert text.prompt_token_ids == hf_tokenizer.encode("The river carried")
    assert text.prompt_token_ids[0] == BOS_TOKEN_ID
    assert engine.eos_token_ids == {EOS_TOKEN_ID}
    assert engine.model_name == "tiny"


def test_model_names_and_paths_that_cannot_be_loaded_are_clear_errors(small_gguf, tmp_path):
    with pytest.raises(ValueError, match=r"'nonexistent' is neither a file, a directory, a Hub id \(org/name\) "
                                         r"nor a known model name \(builtin, smollm2\)"):
        resolve_model("nonexistent", torch.float32, tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"not a \.gguf file"):
        resolve_model(str(tmp_path / "weights.bin"), torch.float32, tmp_path)
    (small_gguf.parent / "second.gguf").write_bytes(small_gguf.read_bytes())
    with pytest.raises(ValueError, match=r"holds 2 .gguf files \(second.gguf, tiny.gguf\); name one of them"):
        resolve_model(str(small_gguf.parent), torch.float32, tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"has neither config\.json"):
        resolve_model(str(tmp_path / "empty"), torch.float32, tmp_path)


def test_builtin_names_the_built_in_model(default_model_path):
    resolved = resolve_model("builtin", torch.float32, default_model_path.parent)
    assert resolved.path == default_model_path and resolved.name == "builtin"
    assert resolve_model(None, torch.float32, default_model_path.parent) == resolved
