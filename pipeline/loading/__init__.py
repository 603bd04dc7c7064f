"""Loading: where a model comes from (a directory, a GGUF file, a packaged or the built-in
model), its tokenizer (with a fast snapshot), the cache directory, the GGUF reader and converter.

May import: nothing else from pipeline/ (model/ imports it, not the other way round).
"""
