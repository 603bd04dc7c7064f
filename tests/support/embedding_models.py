"""Tiny random embedding models for tests, saved as sentence-transformers directories (modules.json,
the Pooling module's config, Normalize when asked): BERT and XLM-R encoders, and a decoder (Qwen3)
with last-token pooling. Every parameter is re-drawn (tests/support/hf_models.py's reasoning), so
pooling and normalisation are exercised by vectors that differ from token to token."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from tests.support.hf_models import _randomize, make_tiny_hf_model

WORDS = ('the', 'cat', 'sat', 'on', 'a', 'mat', 'while', 'dogs', 'ran', 'past', 'quickly', 'under', 'bright',
         'blue', 'skies', 'and', 'green', 'trees', 'rain', 'fell', 'softly', 'over', 'quiet', 'towns', 'as',
         'people', 'walked', 'home')
_SPECIAL = ["[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]"]  # [PAD] = 1: XLM-R counts positions from it

_ENCODERS = {"bert": ("BertConfig", "BertModel", {}),
             "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel", {"type_vocab_size": 1,
                                                                     "max_position_embeddings": 130})}


def write_word_tokenizer(path: Path) -> None:
    vocab = path / "vocab.txt"
    vocab.write_text("\n".join([*_SPECIAL, *WORDS, *(f"w{i}" for i in range(64))]) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(vocab), unk_token="[UNK]", pad_token="[PAD]",
                                               cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    tokenizer.save_pretrained(path)


def make_tiny_encoder(kind: str, path: str | Path, seed: int = 0) -> Path:
    """A random BertModel / XLMRobertaModel checkpoint with a word-level tokenizer (no ST files)."""
    config_name, model_name, overrides = _ENCODERS[kind]
    config = getattr(transformers, config_name)(**{
        "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 128, "pad_token_id": 1, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).float().eval()
    _randomize(model, seed)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    write_word_tokenizer(path)
    return path


def make_tiny_decoder(path: str | Path, seed: int = 0) -> Path:
    """A random Qwen3ForCausalLM checkpoint (tests/support/hf_models.py) with a word-level tokenizer."""
    path = make_tiny_hf_model("qwen3", path, seed=seed, vocab_size=128)
    write_word_tokenizer(Path(path))
    return Path(path)


def save_sentence_transformer(model_dir: Path, out_dir: Path, pooling: str, normalize: bool) -> Path:
    """`model_dir` wrapped as a sentence-transformers model: Transformer, Pooling(pooling), Normalize."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as st_modules

    transformer = st_modules.Transformer(str(model_dir))
    modes = {"mean": "mean", "cls": "cls", "last": "lasttoken"}
    modules = [transformer, st_modules.Pooling(transformer.get_embedding_dimension(), pooling_mode=modes[pooling])]
    if normalize:
        modules.append(st_modules.Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(out_dir))
    return out_dir
