"""The settings benchmarks/check_sampling.py runs: each sampler alone, in combinations, mirostat
over 72 steps, DRY on prompts that repeat (with a breaker inside a repeat and one that would
continue it), XTC with probability 1; beam search and best_of cases."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.request.sampling_params import DEFAULT_DRY_SEQUENCE_BREAKERS, SamplingParams
from pipeline.sampling.dry import SequenceBreakers

MIROSTAT_TOKENS = 72
ALONE: dict[str, dict[str, Any]] = {
    "temperature 0.7": {"temperature": 0.7},
    "greedy": {"temperature": 0.0},
    "top_p 0.8 + top_k 12": {"top_p": 0.8, "top_k": 12},
    "min_p 0.1": {"min_p": 0.1},
    "top_a 0.4": {"top_a": 0.4},
    "tfs 0.8": {"tfs": 0.8},
    "eta 40": {"eta_cutoff": 40.0},
    "epsilon 15": {"epsilon_cutoff": 15.0},
    "typical 0.7": {"typical_p": 0.7},
    "xtc t=0.05 p=1": {"xtc_threshold": 0.05, "xtc_probability": 1.0},
    "smoothing 0.5 curve 2": {"smoothing_factor": 0.5, "smoothing_curve": 2.0},
    "smoothing 0.3 curve 1": {"smoothing_factor": 0.3},
    "dynatemp 0.4-1.8 exp 1.5": {"dynatemp_min": 0.4, "dynatemp_max": 1.8, "dynatemp_exponent": 1.5},
    "penalties": {"repetition_penalty": 1.4, "presence_penalty": 0.5, "frequency_penalty": 0.4},
    "mirostat tau 3 eta 0.3": {"mirostat_mode": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.3,
                               "max_tokens": MIROSTAT_TOKENS},
}
COMBINED: dict[str, dict[str, Any]] = {
    "combo top_p+min_p+tfs+typ+smooth": {"temperature": 0.9, "top_p": 0.9, "min_p": 0.02, "tfs": 0.95,
                                         "typical_p": 0.9, "smoothing_factor": 0.2, "repetition_penalty": 1.2},
    "combo top_k+top_a+eta+eps+xtc": {"temperature": 1.2, "top_k": 30, "top_a": 0.1, "eta_cutoff": 5.0,
                                      "epsilon_cutoff": 3.0, "xtc_threshold": 0.1, "xtc_probability": 1.0},
    "combo dynatemp+min_p+freq": {"dynatemp_min": 0.5, "dynatemp_max": 1.5, "min_p": 0.05,
                                  "frequency_penalty": 0.6},
    "combo mirostat+min_p+smooth": {"temperature": 1.1, "min_p": 0.03, "smoothing_factor": 0.15,
                                    "mirostat_mode": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.1,
                                    "max_tokens": MIROSTAT_TOKENS},
    "combo n=3 typical+xtc p=0.5": {"n": 3, "typical_p": 0.8, "xtc_threshold": 0.1, "xtc_probability": 0.5},
}


def settings(prompts: list[list[int]], breakers: SequenceBreakers, tokens: int
             ) -> dict[str, tuple[list[int], SamplingParams]]:
    common = {"max_tokens": tokens, "ignore_eos": True, "logprobs": 20}
    cases: dict[str, tuple[list[int], SamplingParams]] = {}
    for index, (label, knobs) in enumerate({**ALONE, **COMBINED}.items()):
        cases[label] = (prompts[index % len(prompts)], SamplingParams(**{**common, "seed": 100 + index, **knobs}))
    prompt = prompts[0]
    vocab = breakers.vocab_size
    bias = {prompt[1]: 4.0, prompt[2]: -100.0, (prompt[3] * 7) % vocab: 9.0, (prompt[4] * 13) % vocab: 2.5}
    cases["logit_bias + bans"] = (prompts[1], SamplingParams(**common, seed=7, logit_bias=bias,
                                                             custom_token_bans=[prompt[5], (prompt[6] * 3) % vocab]))
    cases["min_tokens 12 + stop ids"] = (prompts[2], SamplingParams(
        max_tokens=tokens, logprobs=20, seed=8, min_tokens=12, stop_token_ids=[prompt[7], prompt[8]]))
    cases.update(dry_settings(prompts, breakers, common))
    return cases


def dry_settings(prompts: list[list[int]], breakers: SequenceBreakers, common: dict[str, Any]
                 ) -> dict[str, tuple[list[int], SamplingParams]]:
    """Prompts that repeat a phrase, ending inside it, so DRY fires from the first token. With a
    tokenizer, one phrase holds a breaker token in its middle and one ends on a breaker (which
    would continue the repeat: docs/sampling.md never penalises it)."""
    breaker_ids = np.flatnonzero(breakers.mask(DEFAULT_DRY_SEQUENCE_BREAKERS))
    phrase = prompts[3][:7] if len(prompts[3]) >= 7 else [5, 6, 7, 8, 9, 10, 11]
    dry = {"dry_multiplier": 1.5, "dry_base": 1.6, "dry_allowed_length": 2}
    # The prompts end on phrase[3]: DRY penalises phrase[4] (a bias makes it likely enough to sit
    # in the top 20, where the comparison looks); the breaker that would continue a repeat gets one too.
    cases = {
        "dry": ((phrase * 4)[:-3], {**dry, "logit_bias": {phrase[4]: 6.0}}),
        "dry range 12 + rep penalty": ((phrase * 5)[:-2], {**dry, "dry_range": 12, "repetition_penalty": 1.2}),
        "dry greedy": ((phrase * 3)[:-4], {**dry, "temperature": 0.0}),
        "dry + min_p + smoothing": ((phrase * 4)[:-3], {**dry, "min_p": 0.05, "smoothing_factor": 0.3}),
    }
    if len(breaker_ids) > 0:
        inside = [*phrase[:3], int(breaker_ids[0]), *phrase[3:]]
        ending = [*phrase[:4], int(breaker_ids[-1])]
        cases["dry breaker inside repeat"] = ((inside * 4)[:-2], {**dry})
        cases["dry breaker continues repeat"] = ((ending * 4)[:-1], {**dry, "temperature": 0.0,
                                                                     "logit_bias": {int(breaker_ids[-1]): 6.0}})
    return {label: (prompt, SamplingParams(**{**common, "seed": 50 + i, **knobs}))
            for i, (label, (prompt, knobs)) in enumerate(cases.items())}


def beam_cases(prompts: list[list[int]]) -> list[tuple[str, list[int], int, int, float, bool | str, dict]]:
    return [
        ("W=3 n=2 lp=1 early=False", prompts[0], 3, 2, 1.0, False, {}),
        ("W=4 n=3 lp=0.6 early=True", prompts[1], 4, 3, 0.6, True, {}),
        ("W=5 n=2 lp=1.5 early=never", prompts[2], 5, 2, 1.5, "never", {}),
        ("W=3 n=3 rep 1.5", prompts[3], 3, 3, 1.0, False, {"repetition_penalty": 1.5}),
    ]


def best_of_cases(prompts: list[list[int]]) -> list[tuple[str, list[int], int, int, dict]]:
    return [
        ("n=1 best_of=4", prompts[0], 1, 4, {}),
        ("n=2 best_of=5 min_p", prompts[1], 2, 5, {"min_p": 0.05}),
        ("n=2 best_of=3 dry+smoothing", prompts[3], 2, 3, {"dry_multiplier": 1.0, "smoothing_factor": 0.3}),
    ]
