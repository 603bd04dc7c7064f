import pytest

from pipeline.config import SpeculativeConfig


def test_vllm_form_parses():
    config = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3,
                                          "prompt_lookup_min": 2})
    assert config == SpeculativeConfig("ngram", 5, 3, 2)


@pytest.mark.parametrize(("data", "message"), [
    ({"model": "/models/draft"}, "speculative_config.model: draft-model speculation is not supported yet"),
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
