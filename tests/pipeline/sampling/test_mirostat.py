"""Mirostat's mu belongs to the choice: it follows the reference replay step by step, and it
survives recompute preemption and a resume from the reply stream (docs/design.md §4, §5)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.worker.recovery.resume import resume_state
from actors.worker.replies import to_wire
from pipeline.request.request import ResumeState
from pipeline.request.sampling_params import SamplingParams
from pipeline.sampling.sampler import Sampler
from queue_adapters.codec import WireReply, decode_reply, encode
from tests.support.engine_helpers import make_engine, run_requests
from tests.support.hf_models import make_tiny_hf_model
from tests.support.sampling_helpers import Row, batch_of, reference_of

MIROSTAT = {"temperature": 1.0, "mirostat_mode": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.3}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_hf_model("llama", tmp_path_factory.mktemp("llama"), seed=5)


def test_mu_follows_the_reference_replay_over_100_steps() -> None:
    generator = np.random.default_rng(11)
    vocab = 64
    sampler = Sampler(vocab)
    params = SamplingParams(max_tokens=None, top_k=40, **MIROSTAT)
    row = Row(params, prompt=[5, 6, 7], output=[], seed=99)
    ours, reference, reference_mu = [], [], None
    for _ in range(100):
        logits = generator.normal(0, 2.5, vocab).astype(np.float32)
        output = sampler(torch.from_numpy(logits[None]), batch_of([row]))
        expected = reference_of(Row(params, row.prompt, row.output, seed=row.seed, mirostat_mu=reference_mu), logits)
        assert output.token_ids[0] == expected.token
        ours.append(float(output.mirostat_mu[0]))
        reference.append(expected.next_mu)
        row.output.append(int(output.token_ids[0]))
        row.mirostat_mu, reference_mu = ours[-1], expected.next_mu  # each side carries its own mu
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-5)
    assert len(set(np.round(ours, 6))) > 50, "mu should move at almost every step"


def test_mu_survives_recompute_preemption(model_dir):
    prompt = list(range(40, 75))
    params = SamplingParams(max_tokens=20, seed=7, ignore_eos=True, n=2, **MIROSTAT)
    alone = run_requests(make_engine(model_dir), {"x": (prompt, params)})["x"]
    # 30 blocks of 4 tokens: the noise grows while x decodes, and x, the newest, is preempted
    # (with this model: after 8 and 11 of its tokens), then recomputed.
    crowded_engine = make_engine(model_dir, block_size=4, num_kv_blocks=30, max_num_batched_tokens=16)
    noise = {f"noise{i}": (list(range(100 + 9 * i, 110 + 9 * i)), SamplingParams(max_tokens=40, temperature=0.0,
                                                                                ignore_eos=True)) for i in range(3)}
    crowded = run_requests(crowded_engine, {**noise, "x": (prompt, params)})["x"]
    assert all(seq.num_preemptions > 0 for seq in crowded["request"].sequences), "x was never preempted"
    for index in (0, 1):
        assert crowded["choices"][index]["token_ids"] == alone["choices"][index]["token_ids"]
        # Equal up to the float noise of logits computed in other batches and KV layouts.
        assert crowded["choices"][index]["mirostat_mu"][-1] == pytest.approx(
            alone["choices"][index]["mirostat_mu"][-1], abs=1e-5)
    # The test has teeth: without mu's updates (eta 0) the same seed picks other tokens.
    frozen = SamplingParams(max_tokens=20, seed=7, ignore_eos=True, n=2, **{**MIROSTAT, "mirostat_eta": 0.0})
    still = run_requests(make_engine(model_dir), {"x": (prompt, frozen)})["x"]
    assert still["choices"][0]["token_ids"] != alone["choices"][0]["token_ids"]


def test_a_resumed_request_continues_with_the_mu_its_reply_stream_carries(model_dir):
    """What the claimer does after a crash: read the reply entries, resume from them."""
    prompt, params = list(range(20, 44)), SamplingParams(max_tokens=24, seed=3, ignore_eos=True, n=2, **MIROSTAT)
    engine = make_engine(model_dir)
    engine.add_request("r", prompt, params)
    deltas = []
    while engine.has_unfinished:
        deltas += engine.step()
    entries = [decode_reply(encode(to_wire(delta))) for delta in deltas]  # through the wire format
    for cut in (1, 9, 17):  # the worker died after writing `cut` entries
        resume = resume_state(entries[:cut], params.n)
        assert all(mu is not None for mu in resume.mirostat_mu)
        rest = _resume(model_dir, prompt, params, resume)
        for index in range(params.n):
            assert _tokens([*entries[:cut], *rest], index) == _tokens(entries, index), (
                f"choice {index} diverged after resuming at entry {cut}")
        assert rest[-1].choices[-1].mirostat_mu == pytest.approx(entries[-1].choices[-1].mirostat_mu, abs=1e-5)
    # The test has teeth: a resume that restarted mu at 2 tau would continue differently.
    forgetful = resume_state(entries[:9], params.n)
    forgetful.mirostat_mu = [None] * params.n
    assert _tokens([*entries[:9], *_resume(model_dir, prompt, params, forgetful)], 0) != _tokens(entries, 0)


def _resume(model_dir, prompt: list[int], params: SamplingParams, resume: ResumeState) -> list[WireReply]:
    engine = make_engine(model_dir)
    request = engine.builder.build("r", params, prompt_token_ids=prompt)
    request.resume_from(resume)
    engine.scheduler.add_request(request)
    engine.outputs.add_request("r", prompt, params, resume)
    rest = []
    while engine.has_unfinished:
        rest += [to_wire(delta) for delta in engine.step()]
    return rest


def _tokens(entries: list[WireReply], index: int) -> list[int]:
    return [t for entry in entries for choice in entry.choices if choice.index == index for t in choice.token_ids]
