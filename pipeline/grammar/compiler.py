"""GrammarCompiler: a canonical structured-output constraint -> a checked llguidance grammar.

Compiling is the slow part (milliseconds for a typical schema, far more for a large one), so it
happens at intake, in a worker thread, and its result is cached by the constraint's text; the
scheduler then only creates matchers from cached grammars. The llguidance tokenizer (the model's
vocabulary as token bytes) is built once, on the first constraint.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Any

from pipeline.grammar.matcher import GrammarMatcher
from pipeline.request.structured_output import StructuredOutput

CACHE_SIZE = 256  # compiled grammars kept (each a few KB to a few MB)
# Whitespace a JSON answer may hold between tokens unless the request gives guided_whitespace_pattern:
# one space or tab, or a newline and up to 20 of indentation (pretty-printed JSON fits). Unbounded
# whitespace, JSON's own rule, lets a model that favours it write nothing else until max_tokens
# (llama.cpp's JSON grammars bound it the same way).
DEFAULT_JSON_WHITESPACE = r"(?:[ \t]?|\n[ \t]{0,20})"


class GrammarCompiler:
    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        if tokenizer is None:
            raise ValueError("structured outputs need the model's tokenizer, and this model has none")
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self._cache: OrderedDict[StructuredOutput, str] = OrderedDict()
        self._lock = threading.Lock()  # intake compiles in worker threads

    @functools.cached_property
    def ll_tokenizer(self) -> Any:
        import llguidance

        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ValueError("structured outputs need a fast (tokenizers-backed) tokenizer")
        try:
            return llguidance.LLTokenizer(backend.to_str(), n_vocab=self.vocab_size, eos_token=self.eos_token_ids)
        except (ValueError, TypeError, RuntimeError) as error:
            raise ValueError(f"structured outputs are not available for this tokenizer: {error}") from None

    def compile(self, constraint: StructuredOutput) -> str:
        """The llguidance grammar of `constraint`; ValueError with the compiler's message if it is invalid."""
        with self._lock:
            if constraint in self._cache:
                self._cache.move_to_end(constraint)
                return self._cache[constraint]
        grammar = self._compile(constraint)
        with self._lock:
            self._cache[constraint] = grammar
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return grammar

    def matcher(self, constraint: StructuredOutput) -> GrammarMatcher:
        return GrammarMatcher(self.ll_tokenizer, self.compile(constraint), self.vocab_size)

    def _compile(self, constraint: StructuredOutput) -> str:
        import llguidance

        kind, spec, whitespace_pattern = constraint
        try:
            if kind == "json":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    spec, overrides={"whitespace_pattern": whitespace_pattern or DEFAULT_JSON_WHITESPACE})
            else:
                grammar = llguidance.grammar_from("grammar" if kind == "grammar" else kind, spec)
        except (ValueError, TypeError) as error:
            raise ValueError(f"structured output ({kind}) does not compile: {error}") from None
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.ll_tokenizer)
        if is_error:
            raise ValueError(f"structured output ({kind}) does not compile: {messages[0]}")
        return grammar
