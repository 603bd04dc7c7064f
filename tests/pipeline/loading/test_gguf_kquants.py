"""A GGUF file of K-quants (and Q5_0, Q8_0) served with `--quantization gguf`: every linear keeps its
tensor's blocks (no int8 requantization), and float32 greedy tokens are transformers' own, reading
the same file dequantized."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import gguf
import pytest
from structlog.testing import capture_logs
from torch import nn

from pipeline.model.cpu.gguf_kernel import load_gguf_linear_kernel
from pipeline.model.layers.gguf_embedding import GgufEmbedding
from pipeline.model.layers.gguf_linear import GgufLinear
from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import assert_greedy_equal, hf_greedy, make_engine, run_requests
from tests.support.gguf_files import hf_model_from_gguf, write_gguf
from tests.support.hf_models import make_tiny_hf_model

Q = gguf.GGMLQuantizationType
pytestmark = pytest.mark.skipif(load_gguf_linear_kernel() is None, reason="no C compiler for the native kernels")

# A Q4_K_M-like mix, with one more type per projection so every decoder runs in one small file
# (K-quants need rows of 256: hidden 256, intermediate 512).
MIX = {"attn_q": Q.Q4_K, "attn_k": Q.Q5_0, "attn_v": Q.Q6_K, "attn_output": Q.Q8_0, "ffn_gate": Q.Q4_K,
       "ffn_up": Q.Q5_K, "ffn_down": Q.Q6_K, "token_embd": Q.Q4_K, "output": Q.Q6_K}
SIZES = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2}


def _qtype_of(gguf_name: str) -> Q:
    return MIX[gguf_name.split(".")[-2]]  # "blk.0.attn_q.weight" -> attn_q


@pytest.fixture(scope="module")
def cache_env(default_model_path: Path) -> Iterator[Path]:
    """The session's cache (compiled kernels) as $AQUEDUCT_CACHE_DIR for this module."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AQUEDUCT_CACHE_DIR", str(default_model_path.parent))
        yield default_model_path.parent


@pytest.fixture(scope="module", params=[False, True], ids=["own-head", "tied-head"])
def kquant_file(request, tmp_path_factory, cache_env) -> Path:
    root = tmp_path_factory.mktemp("kquants")
    hf_dir = make_tiny_hf_model("llama", root / "hf", seed=21, tie_word_embeddings=request.param, **SIZES)
    return write_gguf(hf_dir, root / "tiny-kquants.gguf", qtype_of=_qtype_of)


def _file_bytes(path: Path) -> dict[str, tuple[str, int]]:
    """GGUF name -> (type name, the tensor's bytes in the file)."""
    reader = gguf.GGUFReader(path)
    return {t.name: (gguf.GGMLQuantizationType(t.tensor_type).name, int(t.n_bytes)) for t in reader.tensors}


def test_linears_keep_the_files_types_and_bytes(kquant_file):
    with capture_logs() as logs:
        engine = make_engine(kquant_file, quantization="gguf")
    held = {entry["qtype"]: entry["held_as"] for entry in logs if entry["event"] == "GGUF weights held"}
    expected = "column blocks, integer products" if load_gguf_linear_kernel().columns_fast else "file blocks"
    assert set(held) == {"Q4_K", "Q5_0", "Q5_K", "Q6_K", "Q8_0"}  # the start-up log names each type and how
    assert all(expected in way for way in held.values()), held
    assert "embedding rows decoded when looked up" in held["Q4_K"]  # token_embd
    model = engine.runner.model
    layers = {name: module for name, module in model.named_modules() if isinstance(module, GgufLinear)}
    assert not [name for name, module in model.named_modules() if type(module) is nn.Linear]
    attention = model.model.layers[0].self_attn
    assert attention.qkv_proj.qtypes == ["Q4_K", "Q5_0", "Q6_K"]  # q, k, v rows, each in its own type
    assert model.model.layers[1].mlp.gate_up_proj.qtypes == ["Q4_K", "Q5_K"]
    files = _file_bytes(kquant_file)
    head = "output.weight" if "output.weight" in files else "token_embd.weight"
    assert model.lm_head.qtypes == [files[head][0]]
    # The embedding stays in its blocks too, a tied one reading the head's (held once).
    assert isinstance(model.model.embed_tokens, GgufEmbedding)
    assert (model.model.embed_tokens.table is model.lm_head) == (head == "token_embd.weight")
    linear_bytes = sum(size for qtype, size in files.values() if qtype != "F32")
    resident = sum(layer.resident_bytes() for layer in layers.values())  # named_modules: a shared layer once
    # The file's blocks, or the same q and scales in column blocks (Q4_K's 12 scale bytes held as 16):
    # within the 1.1x asked.
    assert linear_bytes <= resident <= 1.03 * linear_bytes


def _greedy_workload(seed: int, count: int = 6) -> dict[str, tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    return {f"r{i}": ([rng.randrange(3, 512) for _ in range(rng.randint(1, 40))],
                      SamplingParams(max_tokens=rng.randint(4, 12), temperature=0.0, ignore_eos=True))
            for i in range(count)}


def test_float32_greedy_tokens_equal_transformers_reading_the_file(kquant_file):
    hf = hf_model_from_gguf(kquant_file)
    engine = make_engine(kquant_file, quantization="gguf")
    assert engine.runner.model.native_decoder is not None  # decode steps run the layers in one native call
    requests = _greedy_workload(seed=9)
    results = run_requests(engine, requests)
    for request_id, (prompt, params) in requests.items():
        theirs, logits = hf_greedy(hf, prompt, params.max_tokens)
        assert_greedy_equal(results[request_id]["choices"][0]["token_ids"], theirs, logits, request_id)
