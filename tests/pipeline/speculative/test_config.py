import pytest

from pipeline.config import SpeculativeConfig


def test_vllm_form_parses():
    config = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3,
                                          "prompt_lookup_min": 2})
    assert config == SpeculativeConfig("ngram", 5, 3, 2)


def test_a_model_other_than_ngram_is_a_draft_model():
    config = SpeculativeConfig.from_dict({"model": "/models/draft", "num_speculative_tokens": 3})
    assert (config.method, config.model, config.num_speculative_tokens) == ("draft_model", "/models/draft", 3)
    assert config.uses_draft_model
    assert SpeculativeConfig.from_dict({"model": "[ngram]"}) == SpeculativeConfig()


@pytest.mark.parametrize(("data", "message"), [
    ({"method": "ngram", "model": "/models/draft"}, "speculative_config.model: method 'ngram' takes no draft model"),
    ({"model": "/models/draft", "prompt_lookup_max": 3}, "prompt_lookup_max apply to prompt lookup"),
    ({"model": 5}, "speculative_config.model must name the draft model"),
    ({"method": "draft_model"}, "speculative_config.model must name the draft model"),
    ({"method": "eagle"}, "speculative_config.method must be one of"),
    ({"num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens must be in"),
    ({"num_speculative_tokens": True}, "speculative_config.num_speculative_tokens must be an integer"),
    ({"num_speculative_tokens": "4"}, "speculative_config.num_speculative_tokens must be an integer"),
    ({"prompt_lookup_min": 0}, "speculative_config.prompt_lookup_min must be >= 1"),
    ({"prompt_lookup_min": 4, "prompt_lookup_max": 2}, "speculative_config.prompt_lookup_max must be in"),
    ({"num_tokens": 3}, "speculative_config: unknown key"),
    ({"disable_by_batch_size": 0}, "speculative_config.disable_by_batch_size must be an integer >= 1 or null"),
    ([1, 2], "speculative_config must be a JSON object"),
])
def test_errors_name_the_field(data, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_dict(data)
