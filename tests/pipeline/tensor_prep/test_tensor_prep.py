"""TensorPrep against a naive per-token reference built from the scheduler's own sequences."""

import random

import numpy as np
import pytest

from pipeline.tensor_prep.prepare import TensorPrep
from tests.support.engine_sim import fake_token, make_request, make_scheduler


def _reference(plan, scheduler, block_size):
    input_ids, positions, slots, seq_lens, logits_indices, sampled = [], [], [], [], [], []
    for seq_id, num_new in plan.num_scheduled_tokens.items():
        seq = scheduler.sequences[seq_id]
        start = seq.num_computed_tokens - num_new  # the scheduler has already advanced it
        for position in range(start, start + num_new):
            input_ids.append(seq.token_ids[position])
            positions.append(position)
            slots.append(seq.block_ids[position // block_size] * block_size + position % block_size)
        seq_lens.append(start + num_new)
        if start + num_new == seq.num_tokens:
            logits_indices.append(len(input_ids) - 1)
            sampled.append(seq_id)
    return input_ids, positions, slots, seq_lens, logits_indices, sampled


@pytest.mark.parametrize("seed", range(5))
def test_prepared_inputs_match_a_per_token_reference(seed):
    rng = random.Random(seed)
    block_size = rng.choice([2, 4, 16])
    min_blocks = 64 // block_size + 1  # room for the longest request (40 prompt + 20 output tokens)
    scheduler = make_scheduler(num_blocks=rng.randint(min_blocks, min_blocks + 40), block_size=block_size,
                               max_num_batched_tokens=rng.randint(8, 64), max_num_seqs=rng.randint(2, 8),
                               prefix_caching=rng.random() < 0.5)
    prep = TensorPrep(8, scheduler.max_model_len, block_size)
    for i in range(12):
        scheduler.add_request(make_request(f"r{i}", prompt_len=rng.randint(1, 40),
                                           max_tokens=rng.randint(1, 20), first_token=rng.choice([0, 1, i])))
    steps = one_token_steps = 0
    while scheduler.has_unfinished:
        plan = scheduler.schedule()
        prepared = prep.prepare(plan)
        ids, positions, slots, seq_lens, logits_indices, sampled = _reference(plan, scheduler, block_size)
        inputs = prepared.inputs
        # decode steps (one token each, each sampled) take a shortcut in prepare: same arrays, same dtypes
        one_token_steps += len(sampled) == len(ids) == len(plan.num_scheduled_tokens)
        assert prepared.sample_seq_ids == sampled
        np.testing.assert_array_equal(inputs.query_start_loc[1:], np.cumsum(list(plan.num_scheduled_tokens.values())))
        assert [array.dtype for array in (inputs.input_ids, inputs.positions, inputs.slot_mapping,
                                          inputs.logits_indices, inputs.query_start_loc, inputs.seq_lens)] == \
            [np.int64] * 4 + [np.int32] * 2
        np.testing.assert_array_equal(prepared.sampling.output_position,
                                      [scheduler.sequences[s].num_tokens - scheduler.sequences[s].num_prompt_tokens
                                       for s in sampled])
        np.testing.assert_array_equal(inputs.input_ids, ids)
        np.testing.assert_array_equal(inputs.positions, positions)
        np.testing.assert_array_equal(inputs.slot_mapping, slots)
        np.testing.assert_array_equal(inputs.seq_lens, seq_lens)
        np.testing.assert_array_equal(inputs.logits_indices, logits_indices)
        for b, seq_id in enumerate(plan.num_scheduled_tokens):
            blocks = scheduler.sequences[seq_id].block_ids
            used = -(-seq_lens[b] // block_size)
            np.testing.assert_array_equal(inputs.block_tables[b, :used], blocks[:used])
        for seq_id in prepared.sample_seq_ids:
            seq = scheduler.sequences[seq_id]
            scheduler.append_token(seq, fake_token(seq.seq_id, seq.num_tokens))
        steps += 1
        assert steps < 2000
    assert 0 < one_token_steps < steps


def test_sampling_rows_carry_each_sequences_parameters():
    scheduler = make_scheduler(block_size=4)
    scheduler.add_request(make_request("greedy", prompt_len=5))
    hot = make_request("hot", prompt_len=6, temperature=0.7, top_k=5, seed=9, min_tokens=3, stop_token_ids=[4])
    scheduler.add_request(hot)
    prep = TensorPrep(4, scheduler.max_model_len, 4)
    prepared = prep.prepare(scheduler.schedule())
    batch = prepared.sampling
    assert batch.temperature.tolist() == pytest.approx([0.0, 0.7])
    assert batch.top_k.tolist() == [0, 5]
    assert batch.seeds.tolist() == [0, 0]
    assert batch.output_position.tolist() == [0, 0]
    # min_tokens bans the stop token (ignore_eos: EOS is not banned) for the second row only.
    assert batch.banned_rows.tolist() == [1] and batch.banned_tokens.tolist() == [4]


def test_prompt_logprob_rows_follow_the_sampling_rows():
    scheduler = make_scheduler(block_size=4, max_num_batched_tokens=6)
    scheduler.add_request(make_request("p", prompt_len=10, prompt_logprobs=2))
    prep = TensorPrep(4, scheduler.max_model_len, 4)
    first = prep.prepare(scheduler.schedule())  # tokens 0..5: no sample, 6 prompt-logprob rows
    assert first.sample_seq_ids == []
    assert first.inputs.logits_indices.tolist() == [0, 1, 2, 3, 4, 5]
    seq = scheduler.requests["p"].sequences[0]
    assert first.prompt_logprob_targets.tolist() == seq.token_ids[1:7]
    second = prep.prepare(scheduler.schedule())  # tokens 6..9: samples at 9, scores 7..9
    assert second.sample_seq_ids == [seq.seq_id]
    assert second.inputs.logits_indices.tolist() == [3, 0, 1, 2]
    assert second.prompt_logprob_segments[0].row_start == 0
    assert second.prompt_logprob_targets.tolist() == seq.token_ids[7:10]
    assert second.prompt_logprob_segments[0].first_position == 6
