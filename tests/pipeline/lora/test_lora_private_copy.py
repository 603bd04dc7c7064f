"""An adapter's files are read once: what it serves afterwards comes from the worker's private copy.

Changing, deleting or re-pointing (a symlink in --lora-root) the user's files after the load changes
nothing, even after the adapter left host memory (max_cpu_loras 1) and came back; a private copy that
is gone or changed fails that adapter's requests with lora_unavailable, and everything else runs on.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from pipeline.config import LoRAConfig
from pipeline.lora.adapter import LoRAError
from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import make_engine
from tests.support.hf_models import make_tiny_hf_model
from tests.support.lora_adapters import ALL_PROJECTIONS, make_peft_adapter, run_with_adapters

PROMPT = [7, 19, 3, 88, 41, 5, 230, 17, 64, 9, 150, 33]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_tiny_hf_model("llama", tmp_path_factory.mktemp("base"), seed=5)


@pytest.fixture
def engine(base, tmp_path, monkeypatch):
    """One device slot and one adapter in host memory: using another adapter evicts the first from both."""
    monkeypatch.setenv("AQUEDUCT_CACHE_DIR", str(tmp_path / "cache"))
    return make_engine(base, num_kv_blocks=64, lora=LoRAConfig(max_loras=1, max_cpu_loras=1, max_lora_rank=8))


def _adapter(base, path, seed):
    return make_peft_adapter(base, path, seed=seed, strength=2.0, r=4, lora_alpha=8, target_modules=ALL_PROJECTIONS)


def _tokens(engine, lora, request_id):
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return run_with_adapters(engine, {request_id: (PROMPT, params, lora)})[request_id]["tokens"]


def _evict(engine, other):
    """Serve `other`: the only slot and the only host-memory place go to it."""
    assert len(_tokens(engine, other, f"evict-{other}")) == MAX_TOKENS
    assert engine.lora_registry.num_in_host_memory == 1


@pytest.mark.parametrize("change", ["overwritten", "deleted"])
def test_adapter_changed_on_disk_after_load_serves_its_loaded_weights(engine, base, tmp_path, change):
    registry = engine.lora_registry
    first = _adapter(base, tmp_path / "first", seed=1)
    registry.load("first", first)
    registry.load("other", _adapter(base, tmp_path / "other", seed=2))
    before = _tokens(engine, "first", "before")
    if change == "overwritten":
        _adapter(base, first, seed=7)
        registry.load("rewritten", first)
        assert _tokens(engine, "rewritten", "rewritten") != before  # the new files do change the answer
    else:
        shutil.rmtree(first)
    _evict(engine, "other")
    assert _tokens(engine, "first", "after") == before
    assert len(_tokens(engine, None, "base")) == MAX_TOKENS  # the engine runs on


@pytest.mark.parametrize("damage", ["changed", "removed"])
def test_damaged_private_copy_fails_only_that_adapters_requests(engine, base, tmp_path, damage):
    registry = engine.lora_registry
    first_id = registry.load("first", _adapter(base, tmp_path / "first", seed=1))
    registry.load("other", _adapter(base, tmp_path / "other", seed=2))  # evicts first from host memory
    copy = registry.private_copy(first_id)
    assert copy is not None and copy.is_relative_to(tmp_path / "cache")
    if damage == "changed":
        data = bytearray(copy.read_bytes())
        data[-1] ^= 0x01  # one bit of one weight: still a valid safetensors file
        copy.write_bytes(bytes(data))
    else:
        copy.unlink()
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    results = run_with_adapters(engine, {"a": (PROMPT, params, "first"), "b": (PROMPT, params, "other"),
                                         "c": (PROMPT, params, None), "a2": (PROMPT, params, "first")})
    failures = engine.scheduler.take_failures()
    assert sorted((failure.request_id, failure.code) for failure in failures) == [
        ("a", "lora_unavailable"), ("a2", "lora_unavailable")]
    assert results["a"]["tokens"] == results["a2"]["tokens"] == []
    assert len(results["b"]["tokens"]) == len(results["c"]["tokens"]) == MAX_TOKENS
    assert not registry.is_servable(first_id)


def test_symlink_in_lora_root_repointed_after_load_changes_nothing(engine, base, tmp_path):
    registry = engine.lora_registry
    root = (tmp_path / "root").resolve()
    link = root / "current"
    root.mkdir()
    link.symlink_to(_adapter(base, root / "v1", seed=1))
    outside = _adapter(base, tmp_path / "outside", seed=7)
    registry.load("linked", link, root)
    registry.load("other", _adapter(base, root / "other", seed=2), root)
    before = _tokens(engine, "linked", "before")
    link.unlink()
    link.symlink_to(outside)
    _evict(engine, "other")
    assert _tokens(engine, "linked", "after") == before
    registry.load("outside", outside)  # no root: allowed, and its answer differs
    assert _tokens(engine, "outside", "outside") != before


def test_lora_root_is_checked_where_the_files_are_read(engine, base, tmp_path):
    """A link inside the root when the load is reserved, outside by the time it is read: refused."""
    registry = engine.lora_registry
    root = (tmp_path / "root").resolve()
    link = root / "current"
    root.mkdir()
    link.symlink_to(_adapter(base, root / "v1", seed=1))
    adapter_id = registry.reserve("linked", link, root)
    link.unlink()
    link.symlink_to(_adapter(base, tmp_path / "outside", seed=7))
    with pytest.raises(LoRAError, match="outside --lora-root"):
        registry.complete(adapter_id)
    assert "linked" not in registry.names()


def test_adapter_given_a_slot_stays_in_host_memory_until_the_device_takes_it(engine, base, tmp_path):
    """Two slot loads in one plan with room for one adapter in host memory: the first is not evicted by
    the second before the device copies it, so its copy is not read again (here: could not be)."""
    registry = engine.lora_registry
    first_id = registry.load("first", _adapter(base, tmp_path / "first", seed=1))
    loaded = {key: pair[0].clone() for key, pair in registry.adapter(first_id).weights.items()}
    other_id = registry.load("other", _adapter(base, tmp_path / "other", seed=2))
    assert registry.prepare(first_id)  # read back: "other" was the one in host memory
    registry.hold(first_id)
    assert registry.prepare(other_id)
    registry.hold(other_id)
    registry.private_copy(first_id).unlink()
    taken = registry.adapter(first_id)
    assert taken.weights.keys() == loaded.keys()
    assert all(torch.equal(taken.weights[key][0], loaded[key]) for key in loaded)
    assert registry.is_servable(first_id)
    registry.adapter(other_id)
    assert registry.num_in_host_memory == 1  # taken: the LRU bound applies again
