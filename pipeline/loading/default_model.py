"""The built-in default model: a tiny random-weight Llama with a BPE tokenizer trained on a bundled corpus.

Nothing may be downloaded at run time, so when no --model is given the engine generates this model
locally on first use. It is deterministic (same corpus, same seed, same bytes on disk), which lets
tests and fidelity checks compare against HF transformers without shipping weights in the repo.
"""

from __future__ import annotations

import importlib.resources
import math
import os
import pathlib
import shutil
import tempfile
import time
from typing import TYPE_CHECKING

import structlog

from pipeline.loading.cache_dir import cache_dir as aqueduct_cache_dir
from pipeline.loading.cache_dir import publish_directory

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

logger = structlog.get_logger(__name__)

# Bump when anything below changes the generated files, so stale caches are never reused.
DEFAULT_MODEL_VERSION = 1
DEFAULT_MODEL_DIRNAME = f"default-model-v{DEFAULT_MODEL_VERSION}"

EOS_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (EOS_TOKEN, IM_START_TOKEN, IM_END_TOKEN)  # ids 0, 1, 2

VOCAB_SIZE = 4096
HIDDEN_SIZE = 256
MODEL_SEED = 0
# Each linear layer roughly preserves activation scale with std 1/sqrt(fan_in), so every layer
# contributes and the output depends on context; the head is then sharpened so logits have std
# ~4 and greedy decoding is not a sea of near-ties.
INITIALIZER_RANGE = 1.0 / math.sqrt(HIDDEN_SIZE)
LM_HEAD_SCALE = 4.0

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def default_model_dir(cache_dir: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """Return the directory of the built-in model, generating it on first use.

    Safe under concurrency: the model is built in a private sibling directory and renamed into
    place, so a reader sees either no directory or a complete one.
    """
    root = pathlib.Path(cache_dir) if cache_dir is not None else aqueduct_cache_dir()
    target = root / DEFAULT_MODEL_DIRNAME
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_DIRNAME}.", dir=root))
    try:
        started = time.perf_counter()
        logger.info("generating default model", path=str(target))
        write_default_model(staging)
        publish_directory(staging, target)
        logger.info("default model ready", path=str(target),
                    seconds=round(time.perf_counter() - started, 2))
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def write_default_model(out_dir: str | os.PathLike[str]) -> None:
    """Write tokenizer, config, weights and generation config into an existing directory."""
    out = pathlib.Path(out_dir)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(out)
    model = build_model(eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN))
    model.save_pretrained(out, safe_serialization=True)


def load_corpus() -> str:
    """The bundled training text (shipped as package data)."""
    resource = importlib.resources.files("pipeline.loading") / "data" / "corpus.txt"
    return resource.read_text(encoding="utf-8")


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on the corpus.

    The `tokenizers` trainer breaks count ties by pair order, so the result does not depend on
    hash seeds or thread scheduling (checked by a test that generates twice).
    """
    # Imported here: transformers takes seconds to import and most callers only need the path.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(load_corpus().splitlines(keepends=True), trainer)
    # Every id the model can emit must decode, so a short vocabulary is a bug, not a warning.
    if backend.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer vocab must be {VOCAB_SIZE}, got {backend.get_vocab_size()}")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=[IM_START_TOKEN, IM_END_TOKEN],
        model_max_length=2048,
        # Cleanup rewrites " ." to "." and so on, which would make incremental decoding disagree
        # with a full decode at token boundaries.
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(eos_token_id: int) -> LlamaForCausalLM:
    """A ~5M-parameter Llama with seeded random weights, float32."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        initializer_range=INITIALIZER_RANGE,
        tie_word_embeddings=False,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=None,
        dtype="float32",
    )
    # fork_rng: seed construction without disturbing the caller's global RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(MODEL_SEED)
        model = LlamaForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(LM_HEAD_SCALE)
    model.generation_config = GenerationConfig(
        bos_token_id=eos_token_id, eos_token_id=eos_token_id, pad_token_id=eos_token_id,
    )
    return model

