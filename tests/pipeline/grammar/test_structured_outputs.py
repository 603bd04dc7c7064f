"""Structured outputs in the engine: every spelling folds into one constraint, the output always
parses, HF with the same grammar mask is the oracle for greedy tokens, and preemption, chunked
prefill, prefix caching, n > 1 and crash resume leave the tokens unchanged."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jsonschema_rs
import numpy as np
import pytest
import torch
import transformers

from pipeline.request.sampling_params import SamplingParams
from pipeline.sampling.grammar_mask import apply_token_bitmasks
from tests.support.engine_helpers import make_engine, resumed_tokens, run_requests
from tests.support.grammar_oracle import GrammarMask
from tests.support.hf_models import make_tiny_hf_model

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 10},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
# The random test models love whitespace; a JSON constraint without a pattern lets them fill
# max_tokens with it (as any flexible-whitespace JSON grammar would).
TIGHT = "[ ]?"
CONSTRAINTS = {
    "json": {"guided_json": PERSON, "guided_whitespace_pattern": TIGHT},
    "regex": {"guided_regex": r"[0-9]{3}-[a-z]{2,4}"},
    "choice": {"guided_choice": ["alpha", "beta", "gamma delta"]},
    "grammar": {"guided_grammar": 'root ::= "(" [a-c]+ ")" | "none"'},
}
# (response_format json_object is the schema {"type": "object"}, checked as a spelling below: a random
# model given any object writes one string until max_tokens, so it is not among the kinds that end.)


def _valid(kind: str, text: str) -> bool:
    if kind == "json":
        return jsonschema_rs.Draft202012Validator(PERSON).is_valid(json.loads(text))
    if kind == "regex":
        return re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", text) is not None
    if kind == "choice":
        return text in ("alpha", "beta", "gamma delta")
    return re.fullmatch(r"\([a-c]+\)|none", text) is not None


@pytest.fixture(scope="module")
def unseen_model(default_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Qwen2 the engine has never seen, with the built-in model's tokenizer (4,096 tokens)."""
    path = make_tiny_hf_model("qwen2", tmp_path_factory.mktemp("so-qwen2"), seed=11, vocab_size=4096)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_path / name, path / name)
    return path


# ---- the request fields -----------------------------------------------------------------------

@pytest.mark.parametrize("given", [
    {"guided_json": PERSON},
    {"guided_json": json.dumps(PERSON)},
    {"structured_outputs": {"json": PERSON}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}},
])
def test_every_spelling_of_a_schema_is_one_constraint(given: dict) -> None:
    assert SamplingParams.from_dict(given).structured_outputs == ("json", json.dumps(PERSON, sort_keys=True), "")


def test_choice_regex_grammar_and_json_object_spellings() -> None:
    assert SamplingParams.from_dict({"guided_choice": ["a", "b"]}).structured_outputs == \
        SamplingParams.from_dict({"structured_outputs": {"choice": ["a", "b"]}}).structured_outputs
    assert SamplingParams.from_dict({"guided_regex": "a+"}).structured_outputs == ("regex", "a+", "")
    any_object = ("json", json.dumps({"type": "object"}), "")
    assert SamplingParams.from_dict({"structured_outputs": {"json_object": True}}).structured_outputs == any_object
    assert SamplingParams.from_dict({"response_format": {"type": "json_object"}}).structured_outputs == any_object
    assert SamplingParams.from_dict({"response_format": {"type": "text"}}).structured_outputs is None
    assert SamplingParams.from_dict({"response_format": None, "guided_json": None}).structured_outputs is None
    nameless = {"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}}  # llama.cpp's
    assert SamplingParams.from_dict(nameless).structured_outputs == ("json", json.dumps(PERSON, sort_keys=True), "")


def test_disable_any_whitespace_gives_compact_json(default_model_path: Path) -> None:
    """vLLM's `disable_any_whitespace`: nothing between a JSON answer's tokens."""
    given = {"structured_outputs": {"json": PERSON, "disable_any_whitespace": True}}
    assert SamplingParams.from_dict(given).structured_outputs[2] == "(?:)"
    engine = make_engine(default_model_path)
    params = SamplingParams.from_dict({**given, "max_tokens": 40, "temperature": 1.0, "seed": 3})
    choice = run_requests(engine, {"compact": ("Who?", params)})["compact"]["choices"][0]
    text = choice["text"]
    assert choice["finish_reason"] == "stop", text
    assert text == json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False), text
    with pytest.raises(ValueError, match="cannot be combined"):
        SamplingParams.from_dict({"structured_outputs": {"json": PERSON, "disable_any_whitespace": True,
                                                         "whitespace_pattern": " "}})


@pytest.mark.parametrize("given, message", [
    ({"guided_choice": ["a"], "guided_regex": "b"}, "guided_choice and guided_regex"),
    ({"response_format": {"type": "json_object"}, "guided_json": {}}, "guided_json and response_format"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "exactly one of"),
    ({"guided_choice": []}, "non-empty list of strings"),
    ({"guided_json": "{not json"}, "not valid JSON"),
    ({"guided_regex": "a", "guided_whitespace_pattern": " "}, "JSON constraints only"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"guided_json": PERSON, "use_beam_search": True, "best_of": 2, "temperature": 0}, "use_beam_search"),
    ({"guided_regex": "a" * 70_000}, "at most 65536 characters"),
])
def test_bad_constraints_are_errors_naming_the_field(given: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        SamplingParams.from_dict(given)


@pytest.mark.parametrize("given, message", [
    ({"guided_regex": "a("}, "unclosed group"),
    ({"guided_grammar": "root ::= missing"}, "missing"),
    ({"guided_json": {"type": "no-such-type"}}, "no-such-type"),
])
def test_a_constraint_that_does_not_compile_is_the_request_s_error(default_model_path: Path, given: dict,
                                                                   message: str) -> None:
    engine = make_engine(default_model_path)
    with pytest.raises(ValueError, match="does not compile") as refused:
        engine.add_request("r", "hi", SamplingParams.from_dict({"max_tokens": 4, **given}))
    assert message in str(refused.value)
    assert not engine.has_unfinished


# ---- stage 0 -----------------------------------------------------------------------------------

def test_the_bitmask_masks_exactly_the_tokens_whose_bit_is_clear() -> None:
    generator = np.random.default_rng(3)
    logits = torch.randn(5, 70)
    words = generator.integers(-2**31, 2**31, size=(3, 3), dtype=np.int64).astype(np.int32)
    rows = np.array([0, 2, 4])
    masked = apply_token_bitmasks(logits.clone(), rows, words)
    for index, row in enumerate(rows):
        for token in range(70):
            allowed = (int(words[index, token // 32]) >> (token % 32)) & 1
            assert torch.isinf(masked[row, token]) != bool(allowed)
    assert torch.equal(masked[[1, 3]], logits[[1, 3]])


# ---- outputs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(CONSTRAINTS))
def test_every_choice_of_every_kind_parses(unseen_model: Path, kind: str) -> None:
    engine = make_engine(unseen_model)
    requests = {f"{kind}-{temperature}": ("Output:", SamplingParams.from_dict(
        {"max_tokens": 48, "temperature": temperature, "seed": 5, "n": 3, **CONSTRAINTS[kind]}))
        for temperature in (0.0, 1.0)}
    for request_id, result in run_requests(engine, requests).items():
        assert len(result["choices"]) == 3
        for choice in result["choices"].values():
            assert choice["finish_reason"] == "stop", (request_id, choice)
            assert _valid(kind, choice["text"]), (request_id, choice["text"])


def test_a_request_that_reaches_max_tokens_first_ends_with_length(unseen_model: Path) -> None:
    engine = make_engine(unseen_model)
    params = SamplingParams.from_dict({"max_tokens": 3, "temperature": 0, **CONSTRAINTS["json"]})
    result = run_requests(engine, {"r": ("Output:", params)})["r"]["choices"][0]
    assert result["finish_reason"] == "length" and len(result["token_ids"]) == 3


@pytest.mark.parametrize("kind", ["json", "regex", "grammar"])
def test_greedy_tokens_equal_hf_with_the_same_mask(unseen_model: Path, kind: str) -> None:
    engine = make_engine(unseen_model)
    params = SamplingParams.from_dict({"max_tokens": 40, "temperature": 0, **CONSTRAINTS[kind]})
    prompt = engine.tokenizer.encode("Output:")
    ours = run_requests(engine, {"r": (prompt, params)})["r"]["choices"][0]["token_ids"]
    assert engine.grammars is not None
    grammar = engine.grammars.compile(params.structured_outputs)
    model = transformers.AutoModelForCausalLM.from_pretrained(unseen_model).eval()
    eos = sorted(engine.eos_token_ids)
    mask = GrammarMask((unseen_model / "tokenizer.json").read_text(), grammar, engine.vocab_size, eos)
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, logits_processor=[mask],
                             eos_token_id=sorted(engine.eos_token_ids), pad_token_id=0)
    theirs = out[0, len(prompt):].tolist()
    assert ours == theirs
    assert theirs[-1] in engine.eos_token_ids  # the grammar completed and allowed only EOS


def test_preemption_chunked_prefill_and_prefix_caching_leave_the_tokens_unchanged(unseen_model: Path) -> None:
    requests = {f"r{index}": ("Output: " * (index + 1), SamplingParams.from_dict(
        {"max_tokens": 40, "temperature": 1.0, "seed": index, **CONSTRAINTS["json"]})) for index in range(6)}

    def tokens(**engine_options) -> dict[str, list[int]]:
        engine = make_engine(unseen_model, **engine_options)
        results = run_requests(engine, requests)
        if "num_kv_blocks" in engine_options:
            assert engine.scheduler.num_preemptions > 0  # the small cache really preempted
        return {request_id: result["choices"][0]["token_ids"] for request_id, result in results.items()}

    reference = tokens(prefix_caching=False)
    assert tokens(num_kv_blocks=24, block_size=4) == reference
    assert tokens(max_num_batched_tokens=8) == reference  # chunked prefill
    assert tokens(prefix_caching=True) == reference


def test_a_resumed_request_continues_its_grammar(unseen_model: Path) -> None:
    params = SamplingParams.from_dict({"max_tokens": 40, "temperature": 1.0, "seed": 9, "n": 2,
                                       **CONSTRAINTS["json"]})
    whole = run_requests(make_engine(unseen_model), {"r": ("Output:", params)})["r"]["choices"]
    engine = make_engine(unseen_model)
    request = engine.builder.build("r", params, prompt="Output:")
    cut = [whole[0]["token_ids"][:5], whole[1]["token_ids"][:9]]
    rest = resumed_tokens(engine, request, cut)
    for index in (0, 1):
        assert cut[index] + rest[index] == whole[index]["token_ids"]


def test_a_complete_grammar_ends_the_choice_on_eos_or_where_eos_cannot_end_it(unseen_model: Path) -> None:
    engine = make_engine(unseen_model)
    choice = {"guided_choice": ["alpha", "beta"], "temperature": 0, "max_tokens": 20}
    results = run_requests(engine, {
        "eos": ("Output:", SamplingParams.from_dict(choice)),
        "min_tokens": ("Output:", SamplingParams.from_dict({**choice, "min_tokens": 15})),
        "ignore_eos": ("Output:", SamplingParams.from_dict({**choice, "ignore_eos": True})),
    })
    ended_on_eos = results["eos"]["choices"][0]
    assert ended_on_eos["token_ids"][-1] in engine.eos_token_ids and ended_on_eos["text"] in ("alpha", "beta")
    for request_id in ("min_tokens", "ignore_eos"):  # EOS cannot end these: the grammar's last token does
        result = results[request_id]["choices"][0]
        assert result["finish_reason"] == "stop" and result["text"] == ended_on_eos["text"]
        assert result["token_ids"] == ended_on_eos["token_ids"][:-1]


def test_stop_tokens_are_allowed_where_the_grammar_could_end(unseen_model: Path) -> None:
    engine = make_engine(unseen_model)
    seven = engine.tokenizer.encode("7", add_special_tokens=False)[0]  # never allowed by [a-z] itself
    assert not re.fullmatch("[a-z]*", engine.tokenizer.decode([seven]))
    # The bias makes "7" win wherever it is allowed: only where the grammar could end, as a stop token.
    params = SamplingParams.from_dict({"guided_regex": "[a-z]{3,30}", "temperature": 0, "max_tokens": 30,
                                       "stop_token_ids": [seven], "logit_bias": {str(seven): 100}})
    result = run_requests(engine, {"s": ("Output:", params)})["s"]["choices"][0]
    assert result["stop_reason"] == seven and result["token_ids"][-1] == seven
    assert re.fullmatch("[a-z]{3,}", result["text"]), result
    shorter = engine.tokenizer.decode(result["token_ids"][:-2])
    assert len(shorter) < 3  # it stopped at the first place the grammar could end


def test_a_json_answer_closes_within_its_budget_keeping_the_models_tokens(default_model_path: Path) -> None:
    """A random model given any object writes one string until max_tokens: with the budget nearly spent
    the mask allows only the text that closes the JSON, so each answer ends (stop) as an object, and the
    tokens before the closing are those the same seed samples with a larger budget."""
    engine = make_engine(default_model_path)
    requests = {f"{budget}-{seed}": ("Describe a pet.", SamplingParams.from_dict({
        "response_format": {"type": "json_object"}, "max_tokens": budget, "temperature": 1.0, "seed": seed}))
        for budget in (16, 200) for seed in range(6)}
    results = run_requests(engine, requests)
    for seed in range(6):
        short, long = results[f"16-{seed}"]["choices"][0], results[f"200-{seed}"]["choices"][0]
        assert short["finish_reason"] == "stop", short["text"]
        assert isinstance(json.loads(short["text"]), dict)
        assert len(short["token_ids"]) <= 16
        kept = 0
        while kept < len(short["token_ids"]) and short["token_ids"][kept] == long["token_ids"][kept]:
            kept += 1
        assert kept >= len(short["token_ids"]) - 6, (short["text"], long["text"])  # only the closing differs
