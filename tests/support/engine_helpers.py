"""Test helpers: build an engine on a model directory, run requests to completion, HF greedy oracle (and
the check of greedy tokens and logprobs against it)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from pipeline.config import CacheConfig, EngineConfig, LoRAConfig, ModelConfig, SchedulerConfig, SpeculativeConfig
from pipeline.engine import LLMEngine
from pipeline.request.request import ResumeState
from pipeline.request.sampling_params import SamplingParams

NEAR_TIE_MARGIN = 1e-3


def make_engine(model_dir: Path, *, block_size: int = 16, num_kv_blocks: int | None = 512,
                max_num_batched_tokens: int = 512, max_num_seqs: int = 32,
                prefix_caching: bool = True, max_model_len: int | None = None,
                lora: LoRAConfig | None = None, speculative: SpeculativeConfig | None = None,
                chat_template: str | None = None, dtype: str = "float32", quantization: str = "none",
                batch_invariant: bool = False) -> LLMEngine:
    return LLMEngine(EngineConfig(
        model=ModelConfig(quantization=quantization, dtype=dtype, model=str(model_dir), max_model_len=max_model_len,
                          chat_template=chat_template, batch_invariant=batch_invariant),
        cache=CacheConfig(block_size=block_size, num_kv_blocks=num_kv_blocks, enable_prefix_caching=prefix_caching),
        scheduler=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs),
        lora=lora,
        speculative=speculative,
    ))


def run_requests(engine: LLMEngine, requests: dict[str, tuple[Any, SamplingParams]]) -> dict[str, dict]:
    """Submit all, step to completion; per request: choices (token_ids, text, logprobs, finish) and usage."""
    results: dict[str, dict] = {}
    for request_id, (prompt, params) in requests.items():
        request = engine.add_request(request_id, prompt, params)
        results[request_id] = {"choices": {}, "usage": None, "prompt_logprobs": None, "seqs": [], "request": request}
    while engine.has_unfinished:
        for delta in engine.step():
            result = results[delta.request_id]
            result["seqs"].append(delta.seq)
            for choice in delta.choices:
                state = result["choices"].setdefault(
                    choice.index, {"token_ids": [], "text": "", "logprobs": [], "finish_reason": None,
                                   "mirostat_mu": []})
                state["token_ids"] += choice.token_ids
                if choice.mirostat_mu is not None:
                    state["mirostat_mu"].append(choice.mirostat_mu)  # after each delta's tokens
                state["text"] += choice.text
                state["logprobs"] += choice.logprobs or []
                if choice.finish_reason is not None:
                    state["finish_reason"], state["stop_reason"] = choice.finish_reason, choice.stop_reason
            if delta.prompt_logprobs is not None:
                result["prompt_logprobs"] = delta.prompt_logprobs
            if delta.usage is not None:
                result["usage"] = delta.usage
    return results


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int,
              eos_token_id: list[int] | None = None, min_new_tokens: int = 0) -> tuple[list[int], torch.Tensor]:
    """HF greedy tokens and the raw logits of each generated position ([steps, vocab])."""
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = 0
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens or None,
                             do_sample=False, output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt):].tolist()
    return tokens, torch.cat(out.logits).float()


def assert_greedy_equal(ours: list[int], theirs: list[int], their_logits: torch.Tensor, label: str) -> None:
    """Token-for-token equality; a divergence is accepted only at a near-tie of HF's logits."""
    for position, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            top2 = torch.topk(their_logits[position], 2).values
            margin = float(top2[0] - top2[1])
            assert margin < NEAR_TIE_MARGIN, (
                f"{label}: diverged at output {position} (ours {a}, HF {b}) with HF top-2 margin {margin:.2e}")
            return
    assert len(ours) == len(theirs), f"{label}: {len(ours)} tokens vs HF {len(theirs)}"


def resumed_tokens(engine: LLMEngine, request: Any, cut: list[list[int]]) -> dict[int, list[int]]:
    """Crash resume as a worker does it: `request` resumed from each choice's first tokens `cut` (the
    client has them), stepped to the end; per choice index, the tokens generated after the cut."""
    request.resume_from(ResumeState(next_seq=1, output_token_ids=cut, finish_reasons=[None] * len(cut),
                                    stop_reasons=[None] * len(cut)))
    engine.add(request)
    rest: dict[int, list[int]] = {index: [] for index in range(len(cut))}
    while engine.has_unfinished:
        for delta in engine.step():
            for choice in delta.choices:
                rest[choice.index] += choice.token_ids
    return rest


def logprob_workload(seed: int, count: int, max_prompt: int) -> dict[str, tuple[list[int], SamplingParams]]:
    """`count` greedy requests r0, r1, ... of 1 to `max_prompt` random tokens and 4 to 16 new ones, asking
    for the 2 most likely tokens' logprobs beside each chosen one."""
    rng = random.Random(seed)
    return {f"r{i}": ([rng.randrange(3, 512) for _ in range(rng.randint(1, max_prompt))],
                      SamplingParams(max_tokens=rng.randint(4, 16), temperature=0.0, ignore_eos=True, logprobs=2))
            for i in range(count)}


def assert_tokens_and_logprobs_match_hf(hf: torch.nn.Module, requests: dict, results: dict,
                                        tolerance: float) -> None:
    """Each request's greedy tokens are HF's (up to a near-tie divergence), and the chosen and top tokens'
    logprobs are HF's log-softmax within `tolerance` up to that divergence."""
    for request_id, (prompt, params) in requests.items():
        choice = results[request_id]["choices"][0]
        theirs, logits = hf_greedy(hf, prompt, params.max_tokens)
        assert_greedy_equal(choice["token_ids"], theirs, logits, request_id)
        expected = torch.log_softmax(logits, dim=-1)
        same = next((i for i, (a, b) in enumerate(zip(choice["token_ids"], theirs, strict=True)) if a != b),
                    len(theirs))  # logprobs are comparable up to a near-tie divergence
        for step, entry in enumerate(choice["logprobs"][:same]):
            for token_id, logprob in [(entry.token_id, entry.logprob), *entry.top]:
                assert abs(logprob - float(expected[step, token_id])) < tolerance, (request_id, step)
