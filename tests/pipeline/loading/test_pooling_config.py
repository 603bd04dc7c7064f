"""Pooling read from sentence-transformers' files (version 6's `pooling_mode` and the older per-mode flags),
the family defaults without them, and the refusals naming the directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.loading.pooling_config import PoolingConfig, read_pooling_config

_OLD_POOLING = "sentence_transformers.models.Pooling"
_OLD_NORMALIZE = "sentence_transformers.models.Normalize"


def _write(model_dir: Path, pooling: dict, normalize: bool) -> Path:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": _OLD_POOLING}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": _OLD_NORMALIZE})
    (model_dir / "1_Pooling").mkdir(parents=True)
    (model_dir / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (model_dir / "modules.json").write_text(json.dumps(modules))
    return model_dir


@pytest.mark.parametrize(("pooling", "expected"), [
    ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}, "MEAN"),
    ({"pooling_mode_cls_token": True}, "CLS"),
    ({"pooling_mode_lasttoken": True, "pooling_mode_mean_tokens": False}, "LAST"),
    ({"pooling_mode": "lasttoken"}, "LAST"),
])
def test_sentence_transformers_pooling_is_read(tmp_path: Path, pooling: dict, expected: str) -> None:
    assert read_pooling_config(_write(tmp_path, pooling, True), encoder=True) == PoolingConfig(expected, True)
    assert read_pooling_config(_write(tmp_path / "b", pooling, False), encoder=True) == PoolingConfig(expected, False)


def test_without_modules_json_encoders_pool_cls_and_decoders_the_last_token(tmp_path: Path) -> None:
    assert read_pooling_config(tmp_path, encoder=True) == PoolingConfig("CLS", True)
    assert read_pooling_config(tmp_path, encoder=False, normalize=False) == PoolingConfig("LAST", False)


@pytest.mark.parametrize("pooling", [{"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True},
                                     {"pooling_mode": "max"}, {}])
def test_a_pooling_we_cannot_do_is_refused_by_name(tmp_path: Path, pooling: dict) -> None:
    with pytest.raises(ValueError, match="mean, cls or lasttoken"):
        read_pooling_config(_write(tmp_path, pooling, True), encoder=True)


def test_a_bad_flag_value_is_refused() -> None:
    with pytest.raises(ValueError, match="MEAN, CLS, LAST"):
        PoolingConfig("MAX", True)
