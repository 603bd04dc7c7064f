"""Hugging Face Hub model ids (`org/name`) as local directories, through `huggingface_hub`.

`snapshot_download` does the work as vLLM's loader has it do: with a network it resolves the
revision and downloads what is missing into the HF cache (HF_HOME / HF_HUB_CACHE); without one, or
with HF_HUB_OFFLINE=1, it returns the snapshot already in the cache. Only the files the engine
reads are fetched (safetensors weights, configs, tokenizer), never a repo's other weight formats.
"""

from __future__ import annotations

import re
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

# `org/name`, as the Hub spells repo ids (a local path is tried first, so `./org/name` stays a path).
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
ENGINE_FILES = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
                "preprocessor_config.json"]
TOKENIZER_FILES = [name for name in ENGINE_FILES if "safetensors" not in name and name != "preprocessor_config.json"]


def looks_like_hub_id(model: str) -> bool:
    return HUB_ID.match(model) is not None and ".." not in model


def hub_model_dir(repo_id: str, files: list[str] = ENGINE_FILES) -> Path:
    """The local snapshot of `repo_id`'s `files` (patterns; downloaded now if the network allows and
    they are missing or stale); ValueError saying why when there is none."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"the local Hugging Face cache ({constants.HF_HUB_CACHE})"
    try:
        path = Path(snapshot_download(repo_id, allow_patterns=files))
    except (RepositoryNotFoundError, GatedRepoError) as error:
        raise _failed(repo_id, "the Hub has no such model, or it is private or gated (set HF_TOKEN to a token "
                               f"that may read it): {_first_line(error)}") from None
    except RevisionNotFoundError as error:
        raise _failed(repo_id, _first_line(error)) from None
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise _failed(repo_id, f"it is not in {where}, and HF_HUB_OFFLINE is set: download it where the "
                                   "network allows (run once without HF_HUB_OFFLINE)") from None
        raise _failed(repo_id, f"the Hub ({constants.ENDPOINT}) cannot be reached and it is not in {where}") from None
    except (HfHubHTTPError, OSError) as error:
        raise _failed(repo_id, f"downloading from the Hub failed: {_first_line(error)}") from None
    log.info("hub model", model=repo_id, path=str(path), offline=constants.HF_HUB_OFFLINE)
    return path


def _failed(repo_id: str, why: str) -> ValueError:
    return ValueError(f"{repo_id!r} is no local file or directory, and as a Hub id: {why}")


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
