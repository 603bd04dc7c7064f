"""Tokenizer metadata (`tokenizer.ggml.*`) for tiny GGUF files, in the two forms llama.cpp writes.

- byte-level BPE (`gpt2`: tokens and merges), as for Llama 3, Qwen and SmolLM, with a chat template;
- SentencePiece (`llama`: tokens, scores, token types, byte-fallback tokens, no merges), laid out as
  Gemma's: <pad> <eos> <bos> <unk>, then <0x00>..<0xFF>, then the pieces. transformers picks its
  tokenizer class from the architecture, and its Gemma tokenizer only works on such a vocabulary.
Both are trained on the bundled corpus with `tokenizers`.
"""

from __future__ import annotations

import json

import gguf

from tests.support.hf_models import EOS_TOKEN_ID

TOKENIZER_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 (2 = EOS_TOKEN_ID)
BOS_TOKEN_ID = 0
# Starts with the BOS token, as Llama 3's template does: a rendered prompt must not get a second one.
CHAT_TEMPLATE = (
    "<|endoftext|>{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")  # ids 0..3, as in Gemma's vocabulary
_BYTE_TOKENS = tuple(f"<0x{byte:02X}>" for byte in range(256))


def write_byte_level_tokenizer(writer: gguf.GGUFWriter, vocab_size: int, add_bos_token: bool,
                               pad_token_id: int | None) -> None:
    tokens, merges = byte_level_vocabulary(vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if token in TOKENIZER_SPECIALS else gguf.TokenType.NORMAL
                            for token in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(BOS_TOKEN_ID)
    writer.add_eos_token_id(EOS_TOKEN_ID)
    if pad_token_id is not None:  # gguf.SpecialVocab records a pad token when the checkpoint names one
        writer.add_pad_token_id(pad_token_id)
    writer.add_add_bos_token(add_bos_token)
    writer.add_chat_template(CHAT_TEMPLATE)


def write_gemma_tokenizer(writer: gguf.GGUFWriter, vocab_size: int, model: str = "llama") -> None:
    """What Gemma2Model.set_vocab writes: a SentencePiece vocabulary without a space prefix (Gemma 4's
    converter names the model `gemma4`)."""
    pieces = sentencepiece_pieces(vocab_size - len(GEMMA_SPECIALS) - len(_BYTE_TOKENS))
    types = ([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.UNKNOWN] + [gguf.TokenType.BYTE] * len(_BYTE_TOKENS)
             + [gguf.TokenType.NORMAL] * len(pieces))
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre("default")
    writer.add_token_list([*GEMMA_SPECIALS, *_BYTE_TOKENS, *pieces])
    writer.add_token_scores([0.0] * (len(GEMMA_SPECIALS) + len(_BYTE_TOKENS)) + [-float(rank) for rank in
                                                                                range(len(pieces))])
    writer.add_token_types(types)
    for add, token in [(writer.add_pad_token_id, "<pad>"), (writer.add_eos_token_id, "<eos>"),
                       (writer.add_bos_token_id, "<bos>"), (writer.add_unk_token_id, "<unk>")]:
        add(GEMMA_SPECIALS.index(token))
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)


def byte_level_vocabulary(vocab_size: int) -> tuple[list[str], list[str]]:
    """(tokens in id order, merges as 'a b') of a byte-level BPE trained on the bundled corpus."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from pipeline.loading.default_model import load_corpus

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, special_tokens=list(TOKENIZER_SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(load_corpus().splitlines(keepends=True), trainer)
    assert backend.get_vocab_size() == vocab_size
    merges = json.loads(backend.to_str())["model"]["merges"]
    return ([backend.id_to_token(i) for i in range(vocab_size)],
            [merge if isinstance(merge, str) else " ".join(merge) for merge in merges])


def sentencepiece_pieces(count: int) -> list[str]:
    """`count` pieces (spaces spelled ▁): the corpus's characters, then its BPE merges in order, the
    order transformers' Gemma tokenizer rebuilds the merges from."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from pipeline.loading.default_model import load_corpus

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never")
    backend.train_from_iterator(load_corpus().splitlines(keepends=True),
                                trainers.BpeTrainer(vocab_size=count, min_frequency=1, show_progress=False))
    assert backend.get_vocab_size() == count
    return [backend.id_to_token(i) for i in range(count)]
