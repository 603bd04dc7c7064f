"""load_tokenizer: the HF tokenizer on first load, then its snapshot, which must behave the same."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from pipeline.loading.tokenizer import SnapshotTokenizer, load_tokenizer

TEXTS = ["The river runs", "ünïcødé ✓ and\n\n  spaces\t", "東京 😀 café", "<|im_start|>user\nhi<|im_end|>",
         "x<|endoftext|>y", " leading space", "trailing  "]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]


def assert_same_as_hf(ours, model_dir: Path) -> None:
    hf = AutoTokenizer.from_pretrained(str(model_dir))
    for text in TEXTS:
        assert ours.encode(text) == hf.encode(text), text
    ids = [i for text in TEXTS for i in hf.encode(text)] + [0, 1, 2, 3, 4095, 200, 201]
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
        for token_id in ids:  # single ids, as logprob token strings are made
            assert ours.decode([token_id], skip_special_tokens=skip) == hf.decode([token_id], skip_special_tokens=skip)
    assert ours.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == \
        hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)


@pytest.fixture
def model_copy(default_model_path: Path, tmp_path: Path) -> Path:
    """The default model's tokenizer files in a directory a test may edit."""
    target = tmp_path / "model"
    target.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json"):
        shutil.copy(default_model_path / name, target / name)
    return target


def edit_config(model_dir: Path, **changes: object) -> None:
    path = model_dir / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_first_load_is_hf_then_the_snapshot_gives_the_same_results(model_copy: Path, tmp_path: Path) -> None:
    first = load_tokenizer(model_copy, cache_dir=tmp_path / "cache")
    assert not isinstance(first, SnapshotTokenizer)
    assert len(list((tmp_path / "cache" / "tokenizers").glob("*.json"))) == 1
    second = load_tokenizer(model_copy, cache_dir=tmp_path / "cache")
    assert isinstance(second, SnapshotTokenizer)
    assert second.chat_template == first.chat_template
    assert_same_as_hf(first, model_copy)
    assert_same_as_hf(second, model_copy)


def test_snapshot_keeps_what_transformers_set_up(model_copy: Path, tmp_path: Path) -> None:
    """split_special_tokens lives in tokenizer_config.json, not in tokenizer.json: transformers sets
    it on the backend, and the snapshot must carry it."""
    from tokenizers import Tokenizer as Backend

    edit_config(model_copy, split_special_tokens=True)
    hf = AutoTokenizer.from_pretrained(str(model_copy))
    raw = Backend.from_file(str(model_copy / "tokenizer.json"))
    assert hf.encode("<|im_start|>") != raw.encode("<|im_start|>").ids  # the premise of this test
    load_tokenizer(model_copy, cache_dir=tmp_path)
    snapshot = load_tokenizer(model_copy, cache_dir=tmp_path)
    assert isinstance(snapshot, SnapshotTokenizer)
    assert_same_as_hf(snapshot, model_copy)


def test_an_edited_tokenizer_file_is_resolved_again(model_copy: Path, tmp_path: Path) -> None:
    load_tokenizer(model_copy, cache_dir=tmp_path)
    assert isinstance(load_tokenizer(model_copy, cache_dir=tmp_path), SnapshotTokenizer)
    edit_config(model_copy, split_special_tokens=True)
    fresh = load_tokenizer(model_copy, cache_dir=tmp_path)
    assert not isinstance(fresh, SnapshotTokenizer)
    expected = AutoTokenizer.from_pretrained(str(model_copy)).encode("<|im_start|>")
    assert expected != [1]
    assert fresh.encode("<|im_start|>") == expected
    assert load_tokenizer(model_copy, cache_dir=tmp_path).encode("<|im_start|>") == expected


def test_no_snapshot_when_decode_post_processes_text(model_copy: Path, tmp_path: Path) -> None:
    edit_config(model_copy, clean_up_tokenization_spaces=True)
    load_tokenizer(model_copy, cache_dir=tmp_path)
    assert not (tmp_path / "tokenizers").exists()
    assert not isinstance(load_tokenizer(model_copy, cache_dir=tmp_path), SnapshotTokenizer)


def test_a_corrupt_snapshot_is_replaced(model_copy: Path, tmp_path: Path) -> None:
    load_tokenizer(model_copy, cache_dir=tmp_path)
    (path,) = (tmp_path / "tokenizers").glob("*.json")
    path.write_text('{"backend": "not a tokenizer"')
    assert not isinstance(load_tokenizer(model_copy, cache_dir=tmp_path), SnapshotTokenizer)
    assert isinstance(load_tokenizer(model_copy, cache_dir=tmp_path), SnapshotTokenizer)


def test_first_load_is_what_autotokenizer_gives(model_copy: Path, tmp_path: Path) -> None:
    """Even where the class tokenizer_config.json names is not what AutoTokenizer picks (here a
    LlamaTokenizer declared over a byte-level tokenizer.json, which transformers loads as a generic
    backend because LlamaTokenizer would rebuild it differently)."""
    edit_config(model_copy, tokenizer_class="LlamaTokenizer")
    ours = load_tokenizer(model_copy, cache_dir=tmp_path)
    auto = AutoTokenizer.from_pretrained(str(model_copy))
    assert type(ours) is type(auto)
    assert_same_as_hf(ours, model_copy)
    assert_same_as_hf(load_tokenizer(model_copy, cache_dir=tmp_path), model_copy)


def test_directory_without_tokenizer_gives_none(tmp_path: Path) -> None:
    assert load_tokenizer(tmp_path, cache_dir=tmp_path) is None


def test_first_chat_renders_on_several_threads_at_once_all_succeed(model_copy: Path, tmp_path: Path) -> None:
    """A snapshot loads transformers on its first chat render; threads rendering at once (a worker's
    first burst) once raced transformers' lazy imports and answered "cannot import name AutoTokenizer".
    A fresh process, so that nothing was imported before."""
    load_tokenizer(model_copy, cache_dir=tmp_path / "cache")  # writes the snapshot
    code = f"""
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from pipeline.loading.tokenizer import SnapshotTokenizer, load_tokenizer
tokenizer = load_tokenizer(Path({str(model_copy)!r}), cache_dir=Path({str(tmp_path / "cache")!r}))
assert isinstance(tokenizer, SnapshotTokenizer)
messages = {MESSAGES!r}
with ThreadPoolExecutor(8) as pool:
    rendered = list(pool.map(lambda _: tokenizer.apply_chat_template(messages, tokenize=False), range(8)))
assert len(set(rendered)) == 1, rendered
"""
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)
