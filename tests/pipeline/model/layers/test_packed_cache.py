"""The packed native layers of a GGUF model are kept beside its conversion (layers/packed_cache.py): a
second start builds none of them and answers exactly as the first; a cache that cannot be read, or
that does not fit the model, is passed over and written again."""

from __future__ import annotations

import gguf
import pytest
import torch

from pipeline.model.layers import quantized_linear
from pipeline.model.layers.packed_cache import cache_path
from pipeline.model.layers.quantized_linear import Int4Linear, Int8Linear, native_kernel_for
from tests.pipeline.model.layers.test_quantized_linear import PROMPTS, _engine, _greedy
from tests.support.gguf_files import write_gguf
from tests.support.hf_models import make_tiny_hf_model

pytestmark = pytest.mark.skipif(native_kernel_for("auto") is None, reason="no native quantized kernel here")


def _count_packing(monkeypatch) -> dict[str, int]:
    """How many layers are packed from the file (not read from the cache) from now on."""
    made = {"int4": 0, "int8": 0}
    int4_init, int8_from_float = Int4Linear.__init__, Int8Linear.from_float.__func__

    def counting_int4(self, *args, **kwargs):
        made["int4"] += 1
        int4_init(self, *args, **kwargs)

    def counting_int8(cls, *args, **kwargs):
        made["int8"] += 1
        return int8_from_float(cls, *args, **kwargs)

    monkeypatch.setattr(quantized_linear.Int4Linear, "__init__", counting_int4)
    monkeypatch.setattr(quantized_linear.Int8Linear, "from_float", classmethod(counting_int8))
    return made


def test_a_second_start_reads_the_packed_layers_and_answers_the_same(tmp_path, monkeypatch):
    model_dir = make_tiny_hf_model("llama", tmp_path / "llama", seed=11)
    path = write_gguf(model_dir, tmp_path / "packed-q4_1.gguf", gguf.GGMLQuantizationType.Q4_1)
    first = _engine(str(path), "bfloat16", "gguf")
    cache = cache_path(first.model_dir)
    cache.unlink(missing_ok=True)  # another run's: this test writes its own
    made = _count_packing(monkeypatch)
    first = _engine(str(path), "bfloat16", "gguf")
    assert made["int4"] > 0 and cache.exists()
    expected = _greedy(first, PROMPTS[:6], 6)

    made.update(int4=0, int8=0)
    second = _engine(str(path), "bfloat16", "gguf")
    assert made == {"int4": 0, "int8": 0}  # every native layer from the cache
    assert _greedy(second, PROMPTS[:6], 6) == expected

    cache.write_bytes(b"not a torch file")
    third = _engine(str(path), "bfloat16", "gguf")
    assert made["int4"] > 0 and _greedy(third, PROMPTS[:6], 6) == expected
    assert cache.stat().st_size > 100  # written again


def test_an_entry_of_another_shape_is_packed_again(tmp_path, monkeypatch):
    model_dir = make_tiny_hf_model("llama", tmp_path / "llama", seed=12)
    path = write_gguf(model_dir, tmp_path / "packed-shape-q4_1.gguf", gguf.GGMLQuantizationType.Q4_1)
    engine = _engine(str(path), "bfloat16", "gguf")
    expected = _greedy(engine, PROMPTS[:4], 4)
    cache = cache_path(engine.model_dir)
    packed = torch.load(cache, weights_only=True)
    name = next(iter(packed))
    packed[name]["shape"] = torch.tensor([7, 7])
    torch.save(packed, cache)
    made = _count_packing(monkeypatch)
    again = _engine(str(path), "bfloat16", "gguf")
    assert made["int4"] + made["int8"] == 1  # that layer only
    assert _greedy(again, PROMPTS[:4], 4) == expected
    _engine(str(path), "bfloat16", "gguf")
    assert made["int4"] + made["int8"] == 1  # and the cache was written again with it
