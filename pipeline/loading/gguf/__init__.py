"""GGUF files (llama.cpp's format) converted into HF-style model directories the engine loads.

May import: pipeline.loading.cache_dir.
"""

from pipeline.loading.gguf.architectures import GGUF_ARCHITECTURES
from pipeline.loading.gguf.convert import gguf_model_dir

__all__ = ["GGUF_ARCHITECTURES", "gguf_model_dir"]
