"""Loading: where a model comes from (a directory, a GGUF file, a packaged or the built-in
model), its tokenizer (with a fast snapshot), the cache directory, the GGUF reader and converter.

May import: pipeline.request (generation defaults and their checks). pipeline.model imports
loading, not the other way round.
"""
