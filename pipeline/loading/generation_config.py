"""--generation-config: where a model's sampling defaults come from, as vLLM reads them.

    auto  the model directory's generation_config.json (none there: no defaults)
    vllm  none: the sampler's own defaults
    DIR   DIR/generation_config.json (it must exist)

Only vLLM's fields are read: temperature, top_p, top_k, min_p, repetition_penalty, and
max_new_tokens (a cap on every request's max_tokens); bos/eos ids and the rest are not sampling
defaults (eos ids are read by pipeline/model/loader.py). A value the sampler would refuse is an
error at start, naming the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.request.generation_defaults import GenerationDefaults
from pipeline.request.sampling_params import SamplingParams

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
FILE_NAME = "generation_config.json"


def load_generation_defaults(model_dir: str | Path, setting: str = "auto") -> GenerationDefaults:
    if setting == "vllm":
        return GenerationDefaults()
    path = Path(model_dir if setting == "auto" else setting) / FILE_NAME
    if not path.is_file():
        if setting == "auto":
            return GenerationDefaults()
        raise ValueError(f"--generation-config {setting}: no {FILE_NAME} in that directory")
    config = _read(path)
    sampling = {name: config[name] for name in SAMPLING_FIELDS if config.get(name) is not None}
    if sampling.get("top_k") == 0:  # transformers' "no top-k"; the sampler spells it -1
        sampling["top_k"] = -1
    try:
        SamplingParams.from_dict(sampling)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{path}: {error}") from None
    return GenerationDefaults(sampling, _max_new_tokens(config.get("max_new_tokens"), path))


def _read(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: cannot be read as JSON: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: must hold a JSON object")
    return config


def _max_new_tokens(value: Any, path: Path) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{path}: max_new_tokens must be an integer >= 1, got {value!r}")
    return value
