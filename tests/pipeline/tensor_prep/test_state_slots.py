"""State slots (StepInputs.state_slots): each scheduled sequence's persistent-batch row, which a model with a
recurrent state per sequence (Qwen3-Next, Qwen3.5) uses as the slot of that state. Under the scheduler without
prefix caching, with preemption, aborts and chunked prefill, every step's chunks continue their slot's state or
start a new one at position 0: the state pool's own check (pipeline/model/layers/recurrent_state.py) never fires."""

import random

import numpy as np
import pytest
import torch

from pipeline.model.layers.recurrent_state import RecurrentStatePool, RecurrentStateShape
from pipeline.tensor_prep.prepare import TensorPrep
from tests.support.engine_sim import fake_token, make_request, make_scheduler

_SHAPE = RecurrentStateShape(num_layers=1, conv_channels=2, conv_kernel=4, num_heads=1, key_dim=2, value_dim=2)


@pytest.mark.parametrize("seed", range(4))
def test_every_step_continues_its_slots_state_or_starts_one(seed: int) -> None:
    rng = random.Random(seed)
    max_num_seqs = rng.randint(3, 6)
    scheduler = make_scheduler(num_blocks=rng.randint(20, 30), block_size=4, max_num_batched_tokens=rng.randint(8, 32),
                               max_num_seqs=max_num_seqs, prefix_caching=False)
    prep = TensorPrep(max_num_seqs, scheduler.max_model_len, 4)
    pool = RecurrentStatePool(_SHAPE, max_num_seqs, torch.float32, torch.device("cpu"))
    for i in range(14):
        scheduler.add_request(make_request(f"r{i}", prompt_len=rng.randint(1, 60), max_tokens=rng.randint(1, 20),
                                           first_token=i))
    slot_of: dict[int, int] = {}
    steps = 0
    while scheduler.has_unfinished:
        plan = scheduler.schedule()
        for seq_id in plan.removed_seq_ids:
            slot_of.pop(seq_id, None)
        inputs = prep.prepare(plan).inputs
        slots = inputs.state_slots
        assert slots is not None and len(set(slots.tolist())) == len(slots)  # one slot per sequence
        assert slots.min() >= 0 and slots.max() < max_num_seqs
        for seq_id, slot in zip(plan.num_scheduled_tokens, slots.tolist(), strict=True):
            assert slot_of.setdefault(seq_id, slot) == slot  # a running sequence keeps its slot
        pool.step(inputs.positions, inputs.query_start_loc, inputs.seq_lens, slots)  # raises on a broken chain
        for seq_id in list(plan.num_scheduled_tokens):
            seq = scheduler.sequences.get(seq_id)
            if seq is not None and seq.num_computed_tokens == seq.num_tokens:
                scheduler.append_token(seq, fake_token(seq.seq_id, seq.num_tokens))
        if steps == 10:
            scheduler.abort_request("r3")
        steps += 1
        assert steps < 3000
    assert scheduler.num_preemptions > 0


def test_a_step_that_skips_positions_is_caught_by_the_pool() -> None:
    pool = RecurrentStatePool(_SHAPE, 2, torch.float32, torch.device("cpu"))
    pool.step(np.arange(5), np.array([0, 5], np.int32), np.array([5], np.int32), np.array([1], np.int32))
    with pytest.raises(RuntimeError, match="state slot 1 holds a sequence's state up to position 5"):
        pool.step(np.array([7]), np.array([0, 1], np.int32), np.array([8], np.int32), np.array([1], np.int32))
