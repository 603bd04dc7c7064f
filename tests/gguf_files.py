"""Tiny GGUF files for tests, written the way llama.cpp's convert_hf_to_gguf.py writes them.

From a tiny HF checkpoint (tests/hf_models.py): llama.cpp's tensor names, ggml's reversed shape
order (the writer's job), the Q/K row permutation of LlamaModel files, 2-D weights quantized
(norms stay F32, as llama.cpp keeps them), llama3 rope scaling as a `rope_freqs` tensor, and a
GPT-2-style byte-level BPE tokenizer (`tokenizer.ggml.*`) with a chat template. Written
independently of pipeline/gguf, so a convention wrong on one side shows up as a mismatch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

from tests.hf_models import EOS_TOKEN_ID

TOKENIZER_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 (2 = EOS_TOKEN_ID)
BOS_TOKEN_ID = 0
# Starts with the BOS token, as Llama 3's template does: a rendered prompt must not get a second one.
CHAT_TEMPLATE = (
    "<|endoftext|>{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_GGUF_ARCH = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_GLOBAL_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def gguf_name(hf_name: str) -> str:
    stem, kind = hf_name.rsplit(".", 1)
    if stem.startswith("model.layers."):
        _, _, layer, rest = stem.split(".", 3)
        return f"blk.{layer}.{_LAYER_NAMES[rest]}.{kind}"
    return f"{_GLOBAL_NAMES[stem]}.{kind}"


def llama_cpp_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rows (2, d/2) -> (d/2, 2)."""
    return (weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def write_gguf(hf_dir: Path, out_path: Path, qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
               *, architecture: str | None = None, add_bos_token: bool = True) -> Path:
    """`hf_dir` (a tests/hf_models.py checkpoint) as a GGUF file at `out_path`."""
    config = json.loads((hf_dir / "config.json").read_text())
    out_path.parent.mkdir(parents=True, exist_ok=True)
    arch = architecture or _GGUF_ARCH[config["architectures"][0]]
    writer = gguf.GGUFWriter(str(out_path), arch)
    _write_hparams(writer, config)
    _write_tokenizer(writer, config["vocab_size"], add_bos_token)
    _write_tensors(writer, config, load_file(str(hf_dir / "model.safetensors")), qtype,
                   permute=config["architectures"][0] == "LlamaForCausalLM")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def _write_hparams(writer: gguf.GGUFWriter, config: dict) -> None:
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    if head_dim != config["hidden_size"] // config["num_attention_heads"]:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)


def _rope_theta(config: dict) -> float:
    return float((config.get("rope_parameters") or {}).get("rope_theta") or config.get("rope_theta"))


def _rope_scaling(config: dict) -> dict | None:
    scaling = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return scaling if scaling.get("rope_type", scaling.get("type")) == "llama3" else None


def _write_tensors(writer: gguf.GGUFWriter, config: dict, weights: dict[str, np.ndarray],
                   qtype: gguf.GGMLQuantizationType, permute: bool) -> None:
    for hf_name, array in weights.items():
        array = array.astype(np.float32)
        if permute and ".self_attn.q_proj." in hf_name:
            array = llama_cpp_permute(array, config["num_attention_heads"])
        elif permute and ".self_attn.k_proj." in hf_name:
            array = llama_cpp_permute(array, config["num_key_value_heads"])
        _add_tensor(writer, gguf_name(hf_name), array, qtype if array.ndim == 2 else gguf.GGMLQuantizationType.F32)
    if (scaling := _rope_scaling(config)) is not None:
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        writer.add_tensor("rope_freqs.weight", _llama3_rope_freqs(scaling, _rope_theta(config), head_dim))


def _add_tensor(writer: gguf.GGUFWriter, name: str, array: np.ndarray, qtype: gguf.GGMLQuantizationType) -> None:
    if qtype == gguf.GGMLQuantizationType.F32:
        writer.add_tensor(name, array)
    elif qtype == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(name, array.astype(np.float16))
    else:
        writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)


def _llama3_rope_freqs(scaling: dict, theta: float, head_dim: int) -> np.ndarray:
    """What convert_hf_to_gguf.py's LlamaModel stores for llama3 rope: one divisor per frequency."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    divisors = []
    for freq in 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim):
        wavelen = 2 * math.pi / freq
        if wavelen < old_context / high:
            divisors.append(1.0)
        elif wavelen > old_context / low:
            divisors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            divisors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, dtype=np.float32)


def _write_tokenizer(writer: gguf.GGUFWriter, vocab_size: int, add_bos_token: bool) -> None:
    tokens, merges = byte_level_vocabulary(vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if token in TOKENIZER_SPECIALS else gguf.TokenType.NORMAL
                            for token in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(BOS_TOKEN_ID)
    writer.add_eos_token_id(EOS_TOKEN_ID)
    writer.add_add_bos_token(add_bos_token)
    writer.add_chat_template(CHAT_TEMPLATE)


def byte_level_vocabulary(vocab_size: int) -> tuple[list[str], list[str]]:
    """(tokens in id order, merges as 'a b') of a byte-level BPE trained on the bundled corpus."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from pipeline.default_model import load_corpus

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, special_tokens=list(TOKENIZER_SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(load_corpus().splitlines(keepends=True), trainer)
    assert backend.get_vocab_size() == vocab_size
    merges = json.loads(backend.to_str())["model"]["merges"]
    return ([backend.id_to_token(i) for i in range(vocab_size)],
            [merge if isinstance(merge, str) else " ".join(merge) for merge in merges])


def write_minimal_gguf(out_path: Path, architecture: str) -> Path:
    """A file that is a valid GGUF of `architecture` and nothing more (for error paths)."""
    writer = gguf.GGUFWriter(str(out_path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def hf_model_from_gguf(path: Path) -> object:
    """HF transformers' own reading of a GGUF file: its config and its dequantized tensors.

    This is what `AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)` does for llama, qwen2
    and qwen3 files (transformers' legacy GGUF loader), minus its requirement of `accelerate`, which
    the project does not install.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    assert not result.unexpected_keys and set(result.missing_keys) <= {"lm_head.weight"}, result
    model.tie_weights()
    return model.eval()
