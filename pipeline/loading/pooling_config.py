"""How an embedding model pools: read from a sentence-transformers directory, or set by flags.

sentence-transformers lists its modules in modules.json: a Transformer, a Pooling module (its
config, e.g. 1_Pooling/config.json, says `pooling_mode_mean_tokens`, `pooling_mode_cls_token` or
`pooling_mode_lasttoken`) and, for unit vectors, a Normalize module. Without those files an encoder
(BERT-style) pools its CLS token and a decoder its last token, both L2-normalised, as vLLM does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

POOLING_TYPES = ("MEAN", "CLS", "LAST")
# sentence-transformers < 6 set one flag per mode; 6 writes `pooling_mode` by name.
_ST_MODES = {"pooling_mode_mean_tokens": "MEAN", "pooling_mode_cls_token": "CLS", "pooling_mode_lasttoken": "LAST"}
_ST_MODE_NAMES = {"mean": "MEAN", "cls": "CLS", "lasttoken": "LAST"}


@dataclass(frozen=True, slots=True)
class PoolingConfig:
    pooling_type: str  # MEAN, CLS or LAST
    normalize: bool  # L2-normalise the pooled vector

    def __post_init__(self) -> None:
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling type must be one of {', '.join(POOLING_TYPES)}, got {self.pooling_type!r}")


def read_pooling_config(model_dir: str | Path, encoder: bool, pooling_type: str | None = None,
                        normalize: bool | None = None) -> PoolingConfig:
    """The model directory's pooling (or the family's default), with the flags' values over it."""
    found = _from_sentence_transformers(Path(model_dir))
    if found is None:
        found = PoolingConfig("CLS" if encoder else "LAST", normalize=True)
    if pooling_type is not None:
        found = replace(found, pooling_type=pooling_type.upper())
    if normalize is not None:
        found = replace(found, normalize=normalize)
    return found


def _from_sentence_transformers(model_dir: Path) -> PoolingConfig | None:
    modules_path = model_dir / "modules.json"
    if not modules_path.is_file():
        return None
    modules = _read(modules_path)
    if not isinstance(modules, list):
        raise ValueError(f"{modules_path}: expected a list of modules")
    classes = [_class_name(module) for module in modules]
    if "Pooling" not in classes:
        return None
    pooling = modules[classes.index("Pooling")]
    config = _read(model_dir / str(pooling.get("path", "")) / "config.json")
    if not isinstance(config, dict):
        raise ValueError(f"{model_dir}: the Pooling module's config.json must be an object")
    return PoolingConfig(_pooling_type(config, model_dir), normalize="Normalize" in classes)


def _class_name(module: Any) -> str:
    """"sentence_transformers.models.Pooling" (or v6's longer path) -> "Pooling"."""
    return str(module.get("type", "")).rpartition(".")[2] if isinstance(module, dict) else ""


def _pooling_type(config: dict[str, Any], model_dir: Path) -> str:
    named = config.get("pooling_mode")
    chosen = [_ST_MODE_NAMES.get(str(named), str(named))] if named is not None else \
        [kind for key, kind in _ST_MODES.items() if config.get(key)]
    if len(chosen) != 1 or chosen[0] not in POOLING_TYPES:
        raise ValueError(f"{model_dir}: the Pooling module must pool by mean, cls or lasttoken; it says {chosen}")
    return chosen[0]


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from None
