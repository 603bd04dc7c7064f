"""Speculative decoding through the engine on tiny random models: every request's tokens (and
logprobs) equal those without speculation, greedy equals HF, and drafts were really accepted.

The prompts repeat a phrase, and greedy output of a random model soon loops: both give prompt
lookup drafts that the model accepts."""

from __future__ import annotations

import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM

from pipeline.config import SpeculativeConfig
from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import assert_greedy_equal, hf_greedy, make_engine, resumed_tokens, run_requests
from tests.support.gguf_files import write_gguf
from tests.support.hf_models import make_tiny_hf_model
from tests.support.speculative_helpers import compare_with_plain

Q4_1 = gguf.GGMLQuantizationType.Q4_1
NGRAM = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_max=3, prompt_lookup_min=1)
PROMPT = [11, 12, 13, 14, 15, 16, 17, 18] * 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_hf_model("llama", tmp_path_factory.mktemp("llama"), seed=5)


# Every family the tests build: sliding windows (mistral 21, phi3 32, gemma2's alternating layers)
# shorter than the sequences, q/k norms (qwen3), mixture of experts (mixtral).
@pytest.mark.parametrize("arch", ["llama", "llama3", "qwen2", "qwen3", "mistral", "phi3", "mixtral", "gemma2"])
def test_greedy_equals_hf_and_plain_decoding(arch, tmp_path):
    # Seeds whose random model's greedy output repeats enough that some drafts are accepted.
    path = make_tiny_hf_model(arch, tmp_path / arch, seed={"mistral": 6, "phi3": 6}.get(arch, 5))
    requests = {"g": (PROMPT, SamplingParams(max_tokens=48, temperature=0, ignore_eos=True))}
    engine, outputs = compare_with_plain(path, NGRAM, requests, block_size=4)
    assert engine.stats.num_accepted_tokens > 0
    hf = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    theirs, logits = hf_greedy(hf, PROMPT, 48)
    assert_greedy_equal(outputs["g"]["choices"][0]["token_ids"], theirs, logits, arch)


def test_bfloat16_with_4bit_weights_kept_equals_plain_decoding_bit_for_bit(tmp_path):
    """The CPU defaults (bfloat16, a GGUF file's 4-bit weights kept): a verified position's logits are the
    one-row step's bits (csrc/int4_linear.c computes each row alike whatever its neighbours), so outputs
    and logprobs equal plain decoding's exactly, not only up to ties. bfloat16 rounding of each layer's
    output hides most last-bit differences, so the kernel's property itself is pinned in float32 by
    tests/pipeline/model/cpu/test_column_blocks.py."""
    path = write_gguf(make_tiny_hf_model("llama", tmp_path / "llama", seed=4), tmp_path / "tiny-q4_1.gguf", Q4_1)
    sampled = {"max_tokens": 40, "ignore_eos": True, "logprobs": 3}
    requests = {"greedy": (PROMPT, SamplingParams(temperature=0, **sampled)),
                "sampled": (PROMPT, SamplingParams(temperature=0.5, seed=3, **sampled))}
    engine, outputs = compare_with_plain(path, NGRAM, requests, dtype="bfloat16", quantization="gguf")
    assert engine.stats.num_accepted_tokens > 0
    assert any(type(module).__name__ == "Int4Linear" for module in engine.runner.model.modules())
    # Plain decoding with the same row-exact kernels a speculative engine runs (--batch-invariant: no AMX
    # products for many rows, which sum in other orders).
    plain = run_requests(make_engine(path, dtype="bfloat16", quantization="gguf", batch_invariant=True), requests)
    for request_id in requests:
        ours, theirs = outputs[request_id]["choices"][0]["logprobs"], plain[request_id]["choices"][0]["logprobs"]
        assert [entry.logprob for entry in ours] == [entry.logprob for entry in theirs]
        assert [entry.top for entry in ours] == [entry.top for entry in theirs]


def test_sampled_requests_with_stateful_samplers_equal_plain_decoding(model_dir):
    sampled = {"max_tokens": 48, "ignore_eos": True}
    requests = {
        "t03": (PROMPT, SamplingParams(temperature=0.3, seed=1, n=2, **sampled)),
        "penalties": (PROMPT, SamplingParams(temperature=0.5, seed=2, repetition_penalty=1.1, frequency_penalty=0.1,
                                             presence_penalty=0.2, logprobs=2, **sampled)),
        "dry": (PROMPT, SamplingParams(temperature=0.3, seed=2, dry_multiplier=0.5, min_tokens=20, top_k=20,
                                       xtc_probability=0.5, xtc_threshold=0.1, **sampled)),
        "unseeded": (PROMPT, SamplingParams(temperature=0.2, top_p=0.9, **sampled)),
        "best_of": (PROMPT, SamplingParams(temperature=0.4, seed=4, n=1, best_of=3, **sampled)),
        "greedy_logprobs": (PROMPT, SamplingParams(temperature=0, logprobs=3, logit_bias={7: 1.5}, **sampled)),
    }
    engine, _ = compare_with_plain(model_dir, NGRAM, requests)
    assert engine.stats.num_accepted_tokens > 0


def test_mixed_batch_of_prefills_decodes_and_opted_out_requests(model_dir):
    requests = {
        "long": (list(range(20, 200)), SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)),
        "spec": (PROMPT, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)),
        "off": (PROMPT, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, speculative=False)),
        "miro": (PROMPT, SamplingParams(max_tokens=30, temperature=1.0, mirostat_mode=2, mirostat_tau=3.0, seed=3,
                                        ignore_eos=True)),
        "late": (PROMPT[:20], SamplingParams(max_tokens=25, temperature=0.3, seed=9, ignore_eos=True)),
    }
    # A 24-token budget chunks the long prompt over several steps while the others decode and speculate.
    engine, _ = compare_with_plain(model_dir, NGRAM, requests, max_num_batched_tokens=24, block_size=4)
    assert engine.stats.num_accepted_tokens > 0


def test_preemption_with_a_tiny_kv_cache(model_dir):
    requests = {f"r{i}": (PROMPT[i:], SamplingParams(max_tokens=40, temperature=0.3 * (i % 2), seed=i,
                                                      ignore_eos=True))
                for i in range(6)}
    engine, _ = compare_with_plain(model_dir, NGRAM, requests, block_size=4, num_kv_blocks=40,
                                   max_num_batched_tokens=64)
    assert engine.scheduler.num_preemptions > 0
    assert engine.stats.num_accepted_tokens > 0
    assert engine.scheduler.kv_cache.num_free_blocks == 40


def test_stop_tokens_and_max_tokens_inside_an_accepted_run(model_dir):
    greedy = {"temperature": 0, "ignore_eos": True}
    free = run_requests(make_engine(model_dir), {"free": (PROMPT, SamplingParams(max_tokens=48, **greedy))})
    tokens = free["free"]["choices"][0]["token_ids"]
    stop = tokens[30]  # inside the loop the output falls into
    first_stop = tokens.index(stop)
    requests = {f"max{m}": (PROMPT, SamplingParams(max_tokens=m, **greedy)) for m in (17, 22, 29, 33)}
    requests["stop"] = (PROMPT, SamplingParams(max_tokens=48, stop_token_ids=[stop], **greedy))
    requests["stop_shown"] = (PROMPT, SamplingParams(max_tokens=48, stop_token_ids=[stop], min_tokens=first_stop + 1,
                                                     **greedy))
    engine, outputs = compare_with_plain(model_dir, NGRAM, requests)
    assert engine.stats.num_accepted_tokens > 0
    for m in (17, 22, 29, 33):
        assert outputs[f"max{m}"]["choices"][0]["token_ids"] == tokens[:m]
    assert outputs["stop"]["choices"][0]["token_ids"] == tokens[:first_stop + 1]
    assert len(outputs["stop_shown"]["choices"][0]["token_ids"]) > first_stop + 1


def test_stop_strings_with_a_tokenizer(default_model_path):
    prompt = "one two three four five six seven eight, one two three four five six seven eight, one two"
    free = run_requests(make_engine(default_model_path),
                        {"free": (prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))})
    text = free["free"]["choices"][0]["text"].replace("\ufffd", "")
    stops = [text[len(text) // 3: len(text) // 3 + 2], text[2 * len(text) // 3: 2 * len(text) // 3 + 3]]
    requests = {f"stop{i}": (prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, stop=[stop],
                                                    include_stop_str_in_output=bool(i)))
                for i, stop in enumerate(stops)}
    requests["free"] = (prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    engine, outputs = compare_with_plain(default_model_path, NGRAM, requests)
    assert engine.stats.num_draft_tokens > 0
    for i, stop in enumerate(stops):
        assert outputs[f"stop{i}"]["choices"][0]["finish_reason"] == "stop"
        assert outputs[f"stop{i}"]["choices"][0]["text"].endswith(stop) == bool(i)


def test_a_resumed_request_continues_as_without_speculation(model_dir):
    """Crash resume: the new worker starts from the tokens the client has (accepted ones only)."""
    params = SamplingParams(max_tokens=40, temperature=0.3, seed=2, n=2, ignore_eos=True)
    whole = run_requests(make_engine(model_dir), {"r": (PROMPT, params)})["r"]["choices"]
    engine = make_engine(model_dir, speculative=NGRAM)
    request = engine.builder.build("r", params, prompt_token_ids=PROMPT)
    cut = [whole[0]["token_ids"][:7], whole[1]["token_ids"][:13]]
    rest = resumed_tokens(engine, request, cut)
    assert engine.stats.num_accepted_tokens > 0
    for index in (0, 1):
        assert cut[index] + rest[index] == whole[index]["token_ids"]
