"""Grammars for structured outputs: a request's canonical constraint (request/structured_output.py)
compiled once per text by llguidance (`GrammarCompiler`, cached), and one `GrammarMatcher` per
choice that yields the allowed-token bitmask before each sample and advances with each token.

May import: pipeline.request (the canonical constraint). The bitmask travels in the step plan as
bytes, so tensor prep and the sampler never see a matcher.
"""
