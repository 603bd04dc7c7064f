"""Multi-LoRA fidelity against PEFT: one engine run serving the base model and several adapters side
by side must give each request the tokens `PeftModel.from_pretrained(base, dir)` gives it alone."""

from __future__ import annotations

import random
import re
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from pipeline.config import CacheConfig, EngineConfig, LoRAConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine
from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import assert_greedy_equal, hf_greedy
from tests.support.grammar_oracle import GrammarMask
from tests.support.hf_models import make_tiny_hf_model
from tests.support.lora_adapters import ADAPTER_SPECS, make_adapters, peft_model, run_with_adapters


@pytest.fixture(scope="module")
def llama_with_adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = make_tiny_hf_model("llama", root / "base", seed=11)
    return base, make_adapters(base, root, list(ADAPTER_SPECS))


def lora_engine(base, adapters, *, max_loras=4, block_size=16, num_kv_blocks=512, max_num_batched_tokens=512,
                max_num_seqs=32, max_lora_rank=64) -> LLMEngine:
    return LLMEngine(EngineConfig(
        model=ModelConfig(quantization="none", dtype="float32", model=str(base)),
        cache=CacheConfig(block_size=block_size, num_kv_blocks=num_kv_blocks),
        scheduler=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs),
        lora=LoRAConfig(modules=tuple((name, str(path)) for name, path in adapters.items()), max_loras=max_loras,
                        max_lora_rank=max_lora_rank)))


def check_against_peft(base, adapters, requests, results, label, check_logprobs=False):
    models = {None: AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()}
    models.update({name: peft_model(base, path) for name, path in adapters.items()})
    for request_id, (prompt, params, lora) in requests.items():
        theirs, logits = hf_greedy(models[lora], prompt, params.max_tokens)
        ours = results[request_id]["tokens"]
        assert_greedy_equal(ours, theirs, logits, f"{label}/{request_id}/{lora}")
        if check_logprobs and ours == theirs:
            expected = torch.log_softmax(logits, dim=-1)
            for step, entry in enumerate(results[request_id]["logprobs"]):
                assert abs(entry.logprob - float(expected[step, entry.token_id])) < 1e-4, (request_id, step)


def mixed_workload(seed: int, names: list, count: int = 16, shared_prefix: int = 24) -> dict:
    """Prompts that share a prefix (prefix hits within one adapter), each on the base or an adapter."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, 512) for _ in range(shared_prefix)]
    requests = {}
    for index in range(count):
        tail = [rng.randrange(3, 512) for _ in range(rng.randint(1, 40))]
        prompt = shared + tail if index % 2 else tail + shared
        params = SamplingParams(max_tokens=rng.randint(4, 16), temperature=0.0, ignore_eos=True, logprobs=1)
        requests[f"r{index}"] = (prompt, params, names[index % len(names)])
    return requests


def test_mixed_batch_with_preemption_chunking_and_prefix_hits_matches_peft(llama_with_adapters):
    base, adapters = llama_with_adapters
    three = {name: adapters[name] for name in ("attn8", "mlp4", "all16rs")}
    requests = mixed_workload(seed=1, names=[None, "attn8", "mlp4", "all16rs"])
    engine = lora_engine(base, three, block_size=4, num_kv_blocks=60, max_num_batched_tokens=24, max_num_seqs=8)
    results = run_with_adapters(engine, requests)
    assert engine.scheduler.num_preemptions > 0
    assert any(results[r]["usage"].cached_tokens > 0 for r in requests)
    check_against_peft(base, three, requests, results, "mixed", check_logprobs=True)
    assert engine.scheduler.kv_cache.num_free_blocks == 60


def test_more_adapters_than_slots_are_all_served_exactly(llama_with_adapters):
    base, adapters = llama_with_adapters
    requests = mixed_workload(seed=2, names=[*adapters, None], count=12)
    engine = lora_engine(base, adapters, max_loras=2, max_num_batched_tokens=64, max_num_seqs=6)
    adapters_per_step: list[int] = []
    execute = engine.runner.execute

    def counting_execute(inputs):
        if inputs.lora_slots is not None:
            adapters_per_step.append(len(set(inputs.lora_slots[inputs.lora_slots >= 0].tolist())))
        return execute(inputs)

    engine.runner.execute = counting_execute
    results = run_with_adapters(engine, requests)
    assert max(adapters_per_step) == 2  # never more distinct adapters in a step than slots
    assert engine.lora_slots is not None and len(engine.lora_slots.resident()) <= 2
    assert engine.lora_slots.num_loads >= 5  # every adapter went through the two slots
    check_against_peft(base, adapters, requests, results, "5-in-2")


def test_prefix_cache_is_shared_within_an_adapter_never_across(llama_with_adapters):
    base, adapters = llama_with_adapters
    engine = lora_engine(base, adapters, block_size=8)
    prompt = list(range(10, 50))
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    run_with_adapters(engine, {"first": (prompt, params, "attn8")})
    later = {"same": (prompt, params, "attn8"), "other": (prompt, params, "mlp4"), "base": (prompt, params, None)}
    results = {request_id: run_with_adapters(engine, {request_id: request})[request_id]
               for request_id, request in later.items()}
    assert results["same"]["usage"].cached_tokens == 32
    assert results["other"]["usage"].cached_tokens == 0
    assert results["base"]["usage"].cached_tokens == 0


def test_best_of_n_choices_all_use_the_adapter(llama_with_adapters):
    base, adapters = llama_with_adapters
    engine = lora_engine(base, {"all16rs": adapters["all16rs"]})
    prompt = list(range(30, 60))
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, n=2)
    request = engine.add_request("n2", prompt, params, lora="all16rs")
    while engine.has_unfinished:
        engine.step()
    theirs, logits = hf_greedy(peft_model(base, adapters["all16rs"]), prompt, 6)
    for seq in request.sequences:
        assert_greedy_equal(seq.output_token_ids, theirs, logits, f"n2/{seq.choice_index}")


def test_gemma2_adapter_matches_peft(tmp_path):
    base = make_tiny_hf_model("gemma2", tmp_path / "base", seed=5)
    adapters = make_adapters(base, tmp_path, ["all16rs", "attn8"])
    requests = mixed_workload(seed=3, names=[None, "all16rs", "attn8"], count=6)
    results = run_with_adapters(lora_engine(base, adapters, max_num_batched_tokens=32), requests)
    check_against_peft(base, adapters, requests, results, "gemma2")


def test_adapter_with_a_grammar_constraint_matches_peft_with_the_same_mask(tmp_path, default_model_path):
    """A LoRA request under a regex constraint: PEFT's model with the same grammar mask is the oracle, and a
    base-model request with the same constraint in the same batch keeps to its own weights."""
    base = make_tiny_hf_model("llama", tmp_path / "base", seed=13, vocab_size=4096)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_path / name, base / name)
    adapters = make_adapters(base, tmp_path, ["attn8"])
    engine = lora_engine(base, adapters)
    params = SamplingParams.from_dict({"max_tokens": 24, "temperature": 0, "guided_regex": r"[0-9]{2,5}-[a-z]{3,9}"})
    prompt = engine.tokenizer.encode("Code:")
    results = run_with_adapters(engine, {"lora": (prompt, params, "attn8"), "base": (prompt, params, None)})
    grammar = engine.grammars.compile(params.structured_outputs)
    eos = sorted(engine.eos_token_ids)
    models = {"lora": peft_model(base, adapters["attn8"]),
              "base": AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()}
    for request_id, model in models.items():
        mask = GrammarMask((base / "tokenizer.json").read_text(), grammar, engine.vocab_size, eos)
        with torch.inference_mode():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, logits_processor=[mask],
                                 eos_token_id=eos, pad_token_id=0)
        theirs = out[0, len(prompt):].tolist()
        assert results[request_id]["tokens"] == theirs, request_id
        text = engine.tokenizer.decode([t for t in theirs if t not in engine.eos_token_ids])
        assert re.fullmatch(r"[0-9]{2,5}-[a-z]{3,9}", text), (request_id, text)
    assert results["lora"]["tokens"] != results["base"]["tokens"]  # the adapter really changed the answer
