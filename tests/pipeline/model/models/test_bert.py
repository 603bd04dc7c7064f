"""The BERT-style encoder family (pipeline/model/models/bert.py) against HF's BertModel and XLMRobertaModel:
the same last hidden states for a padded batch (padding changes no real row), a task model's checkpoint
(`bert.` prefix, `cls.` head) loads, and a missing weight or an unsupported setting is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from pipeline.model.loader import iter_weights, read_config
from pipeline.model.models import is_encoder
from pipeline.model.models.bert import build_encoder, encoder_config
from tests.support.embedding_models import make_tiny_encoder


@pytest.mark.parametrize("kind", ["bert", "xlm-roberta"])
def test_hidden_states_equal_hf_for_a_padded_batch(tmp_path: Path, kind: str) -> None:
    model_dir = make_tiny_encoder(kind, tmp_path)
    config = read_config(model_dir)
    assert is_encoder(config["architectures"][0])
    ours = build_encoder(config)
    ours.load_weights(iter_weights(model_dir))
    hf = transformers.AutoModel.from_pretrained(model_dir).eval()
    prompts = [[2, 10, 11, 12, 13, 3], [2, 20, 3]]
    ids = torch.tensor([prompts[0], prompts[1] + [0, 0, 0]])
    mask = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
    with torch.no_grad():
        batch = ours(ids, mask)
        for row, prompt in enumerate(prompts):
            expected = hf(input_ids=torch.tensor([prompt])).last_hidden_state[0]
            torch.testing.assert_close(batch[row, :len(prompt)], expected, atol=1e-5, rtol=1e-5)


def test_a_task_model_checkpoint_loads_without_its_head(tmp_path: Path) -> None:
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, max_position_embeddings=64)
    masked = transformers.BertForMaskedLM(config).eval()
    weights = masked.state_dict().items()
    assert any(name.startswith("cls.") for name, _ in weights)
    ours = build_encoder({**config.to_dict(), "architectures": ["BertModel"]})
    ours.load_weights(weights)
    ids = torch.tensor([[2, 5, 6, 3]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, torch.ones_like(ids, dtype=torch.bool)),
                                   masked.bert(input_ids=ids).last_hidden_state, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="missing weights"):
        build_encoder(config.to_dict()).load_weights([])


@pytest.mark.parametrize(("change", "message"), [({"hidden_act": "silu"}, "hidden_act 'silu'"),
                                                 ({"position_embedding_type": "relative_key"}, "relative_key")])
def test_settings_we_do_not_run_are_refused(change: dict, message: str) -> None:
    config = {"vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 2, "max_position_embeddings": 8, **change}
    with pytest.raises(ValueError, match=message):
        encoder_config(config)
