"""The pooling runner's embeddings equal sentence-transformers' (float32, CPU) on tiny random models saved
as sentence-transformers directories: BERT with each pooling kind, a Qwen3 decoder (last token, and mean)
under chunked prefill, and XLM-R against HF's encoder; plus flags over the directory, Matryoshka
dimensions, token-id inputs and the refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.embedding_engine import EmbeddingEngine, EmbeddingJob, wants_pooling
from pipeline.loading.pooling_config import PoolingConfig, read_pooling_config
from tests.support.embedding_models import make_tiny_decoder, make_tiny_encoder, save_sentence_transformer

TEXTS = ["the cat sat on a mat", "dogs ran", "rain fell softly over quiet towns as people walked home " * 4]


def _engine(model_dir: Path, budget: int = 512, **model: object) -> EmbeddingEngine:
    return EmbeddingEngine(EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype="float32", device="cpu", runner="pooling", cpu_linear="torch",
                          **model),  # type: ignore[arg-type]
        cache=CacheConfig(num_kv_blocks=64), scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8)))


def _reference(st_dir: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(st_dir), device="cpu").encode(texts, convert_to_numpy=True)


def _cosines(ours: list[np.ndarray], reference: np.ndarray) -> list[float]:
    return [float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(ours, reference, strict=True)]


def _embed(engine: EmbeddingEngine, texts: list[str], dimensions: int | None = None) -> list[np.ndarray]:
    return engine.embed([engine.job(text, None, dimensions) for text in texts])


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_encoder("bert", tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_decoder(tmp_path_factory.mktemp("qwen3"))


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_bert_embeddings_equal_sentence_transformers(bert_dir: Path, tmp_path: Path, pooling: str) -> None:
    st_dir = save_sentence_transformer(bert_dir, tmp_path / "st", pooling, normalize=True)
    engine = _engine(st_dir)
    assert engine.pooling_config == PoolingConfig({"mean": "MEAN", "cls": "CLS", "last": "LAST"}[pooling], True)
    ours = _embed(engine, TEXTS)
    assert min(_cosines(ours, _reference(st_dir, TEXTS))) >= 0.9999
    assert np.allclose([np.linalg.norm(v) for v in ours], 1.0, atol=1e-5)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_decoder_embeddings_equal_sentence_transformers_under_chunked_prefill(
        qwen3_dir: Path, tmp_path: Path, pooling: str) -> None:
    st_dir = save_sentence_transformer(qwen3_dir, tmp_path / "st", pooling, normalize=True)
    reference = _reference(st_dir, TEXTS)
    assert len(_engine(st_dir).inputs.prompt_ids(TEXTS[2], None)) > 2 * 16  # several chunks of 16 below
    for budget in (512, 16, 7):  # one step; chunks of 16; chunks that split blocks
        assert min(_cosines(_embed(_engine(st_dir, budget=budget), TEXTS), reference)) >= 0.9999


def test_xlm_roberta_equals_hf_mean_pooled(tmp_path: Path) -> None:
    import transformers

    model_dir = make_tiny_encoder("xlm-roberta", tmp_path / "xlmr")
    engine = _engine(model_dir, pooling_type="mean", normalize=False)
    prompts = [[2, 10, 11, 12, 3], [2, 20, 3], list(range(5, 60))]
    hf = transformers.AutoModel.from_pretrained(model_dir).eval()
    with torch.no_grad():
        expected = [hf(input_ids=torch.tensor([p])).last_hidden_state[0].mean(dim=0).numpy() for p in prompts]
    ours = engine.embed([engine.job(None, p, None) for p in prompts])
    assert min(_cosines(ours, np.stack(expected))) >= 0.9999


def test_flags_override_the_directory_and_defaults_follow_the_family(bert_dir: Path, qwen3_dir: Path,
                                                                      tmp_path: Path) -> None:
    assert read_pooling_config(bert_dir, encoder=True) == PoolingConfig("CLS", True)
    assert read_pooling_config(qwen3_dir, encoder=False) == PoolingConfig("LAST", True)
    st_dir = save_sentence_transformer(bert_dir, tmp_path / "st", "mean", normalize=True)
    assert read_pooling_config(st_dir, True, "cls", False) == PoolingConfig("CLS", False)
    unnormalised = _embed(_engine(st_dir, normalize=False), TEXTS[:1])[0]
    assert abs(float(np.linalg.norm(unnormalised)) - 1.0) > 1e-3


def test_runner_auto_pools_headless_models_and_refuses_to_generate_with_them(bert_dir: Path, qwen3_dir: Path) -> None:
    def config(model_dir: Path, runner: str) -> EngineConfig:
        return EngineConfig(model=ModelConfig(model=str(model_dir), runner=runner))

    assert wants_pooling(config(bert_dir, "auto"), bert_dir)
    assert not wants_pooling(config(qwen3_dir, "auto"), qwen3_dir)
    assert wants_pooling(config(qwen3_dir, "pooling"), qwen3_dir)
    with pytest.raises(ValueError, match="--runner pooling"):
        wants_pooling(config(bert_dir, "generate"), bert_dir)


def test_dimensions_truncate_then_renormalise_as_sentence_transformers(bert_dir: Path, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    st_dir = save_sentence_transformer(bert_dir, tmp_path / "st", "mean", normalize=True)
    reference = SentenceTransformer(str(st_dir), device="cpu", truncate_dim=16).encode(
        TEXTS, convert_to_numpy=True, normalize_embeddings=True)
    ours = _embed(_engine(st_dir), TEXTS, dimensions=16)
    assert all(v.shape == (16,) for v in ours)
    assert min(_cosines(ours, reference)) >= 0.9999
    assert np.allclose([np.linalg.norm(v) for v in ours], 1.0, atol=1e-5)


def test_token_ids_give_the_text_s_embedding(bert_dir: Path) -> None:
    engine = _engine(bert_dir)
    ids = engine.tokenizer.encode(TEXTS[0])
    by_text, by_ids = engine.embed([engine.job(TEXTS[0], None, None), engine.job(None, ids, None)])
    assert np.array_equal(by_text, by_ids)


@pytest.mark.parametrize(("prompt", "ids", "dimensions", "message"), [
    ("", None, None, "prompt must not be empty"),
    (None, [], None, "prompt_token_ids must not be empty"),
    (None, [0, 128], None, r"token ids in \[0, 128\)"),
    (None, [5] * 129, None, "the limit is 128"),
    ("the cat", None, 65, "embedding width 64"),
    ("the cat", None, 0, "dimensions must be between 1"),
])
def test_bad_inputs_are_refused_by_name(bert_dir: Path, prompt: str | None, ids: list[int] | None,
                                        dimensions: int | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _engine(bert_dir).job(prompt, ids, dimensions)


def test_a_batch_longer_than_a_wave_keeps_its_order(qwen3_dir: Path) -> None:
    engine = _engine(qwen3_dir, budget=16)
    jobs = [EmbeddingJob(list(range(3, 3 + n))) for n in (40, 1, 70, 5, 33, 2, 9, 60, 11, 4)]
    one_by_one = [engine.embed([job])[0] for job in jobs]
    together = engine.embed(jobs)  # 10 jobs > max_num_seqs 8: two waves
    assert all(np.allclose(a, b, atol=1e-6) for a, b in zip(one_by_one, together, strict=True))


def test_what_pooling_does_not_do_yet_is_refused_at_start(bert_dir: Path) -> None:
    from pipeline.config import LoRAConfig

    with pytest.raises(ValueError, match="does not support LoRA adapters"):
        EmbeddingEngine(EngineConfig(model=ModelConfig(model=str(bert_dir), runner="pooling"), lora=LoRAConfig()))
