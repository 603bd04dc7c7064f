"""The serve benchmark's requests: text prompts of random English words, the same for every server.

Words are drawn, with their frequencies, from the corpus bundled for the built-in model's tokenizer
(pipeline/loading/data/corpus.txt): common English words, about one SmolLM2 token each (the default 32
prompts, 7,354 words, are 7,617 tokens), and no two requests share a prefix a prefix cache could reuse.
A seed fixes every prompt and length: each server gets the same requests in the same order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from pipeline.loading.default_model import load_corpus


@dataclass(frozen=True, slots=True)
class ServeRequest:
    prompt: str
    max_tokens: int  # generated exactly: the requests are greedy with ignore_eos


def corpus_words() -> list[str]:
    """Every word of the bundled corpus, in order, repeats kept (their frequencies)."""
    return re.findall(r"[A-Za-z']+", load_corpus())


def serve_workload(num_requests: int, prompt_words: tuple[int, int], output_len: tuple[int, int],
                   seed: int) -> list[ServeRequest]:
    """`num_requests` prompts of prompt_words[0]..[1] words, each asking for output_len[0]..[1] tokens."""
    rng = np.random.default_rng(seed)
    words = corpus_words()
    word_counts = rng.integers(prompt_words[0], prompt_words[1] + 1, num_requests)
    output_lens = rng.integers(output_len[0], output_len[1] + 1, num_requests)
    return [ServeRequest(" ".join(words[index] for index in rng.integers(0, len(words), count)), int(tokens))
            for count, tokens in zip(word_counts, output_lens, strict=True)]


def warmup_request() -> ServeRequest:
    """One short request each server answers before the timed phases (first-use costs outside them)."""
    return ServeRequest("The water that walked into town", 8)
