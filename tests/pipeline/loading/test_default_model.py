"""The built-in default model: deterministic, loadable by HF transformers, safely published."""

from __future__ import annotations

import hashlib
import pathlib

import pytest

from pipeline.loading import default_model
from pipeline.loading.default_model import DEFAULT_MODEL_DIRNAME, default_model_dir


def file_hashes(directory: pathlib.Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.iterdir()) if path.is_file()}


def test_generation_is_deterministic(default_model_path, tmp_path):
    second = default_model_dir(tmp_path)
    assert second == tmp_path / DEFAULT_MODEL_DIRNAME
    first_hashes = file_hashes(default_model_path)
    expected_files = {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"}
    assert expected_files <= set(first_hashes)
    assert file_hashes(second) == first_hashes


def test_model_loads_with_transformers(default_model_path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(default_model_path)
    config = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (256, 4, 4)
    assert (config.num_key_value_heads, config.intermediate_size, config.vocab_size) == (2, 688, 4096)
    assert config.max_position_embeddings == 2048
    assert not config.tie_word_embeddings
    assert model.dtype == torch.float32
    assert 4_000_000 <= sum(p.numel() for p in model.parameters()) <= 6_000_000
    assert model.generation_config.eos_token_id == 0


def test_logits_are_far_from_uniform(default_model_path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(default_model_path)
    with torch.no_grad():
        logits = model(torch.tensor([[10, 200, 3000, 42, 7]])).logits[0]
    assert logits.std(dim=-1).min() > 2.0


def test_tokenizer_covers_the_vocabulary_and_round_trips_text(default_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    assert len(tokenizer) == 4096
    assert tokenizer.eos_token == tokenizer.bos_token == tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    text = "A café in 東京 serves ramen 🍜 for ¥1,200, naïve as that sounds."
    assert tokenizer.decode(tokenizer.encode(text)) == text
    tokenizer.decode(list(range(4096)))  # every id the model can emit decodes


def test_chat_template_renders(default_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_existing_model_is_reused_without_regenerating(default_model_path, monkeypatch):
    def fail(_out_dir):
        raise AssertionError("must not regenerate")

    monkeypatch.setattr(default_model, "write_default_model", fail)
    assert default_model_dir(default_model_path.parent) == default_model_path


def test_cache_dir_comes_from_the_environment(tmp_path, monkeypatch):
    (tmp_path / DEFAULT_MODEL_DIRNAME).mkdir()
    monkeypatch.setenv("AQUEDUCT_CACHE_DIR", str(tmp_path))
    assert default_model_dir() == tmp_path / DEFAULT_MODEL_DIRNAME


def test_losing_the_publish_race_keeps_the_winner_and_discards_ours(tmp_path, monkeypatch):
    target = tmp_path / DEFAULT_MODEL_DIRNAME

    def write_then_lose_race(out_dir):
        (pathlib.Path(out_dir) / "ours.txt").write_text("ours")
        target.mkdir()
        (target / "winner.txt").write_text("winner")

    monkeypatch.setattr(default_model, "write_default_model", write_then_lose_race)
    assert default_model_dir(tmp_path) == target
    assert [path.name for path in target.iterdir()] == ["winner.txt"]
    assert [path.name for path in tmp_path.iterdir()] == [DEFAULT_MODEL_DIRNAME]


def test_failed_generation_leaves_no_partial_directory(tmp_path, monkeypatch):
    def explode(_out_dir):
        raise RuntimeError("disk full")

    monkeypatch.setattr(default_model, "write_default_model", explode)
    with pytest.raises(RuntimeError, match="disk full"):
        default_model_dir(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_corpus_is_bundled_and_multilingual():
    corpus = default_model.load_corpus()
    assert 30_000 <= len(corpus.encode("utf-8")) <= 60_000
    for word in ("café", "naïve", "東京", "😀"):
        assert word in corpus

