"""Fair share between tenants inside a worker's steps (priority policy): seats, then step tokens.

Fair queueing (fair_share.py) orders admission, which is enough while seats are free. Two things
it cannot do on its own:
- Seats. A tenant that already holds every seat (`max_num_seqs`) keeps them until its sequences
  finish, and another tenant's requests wait behind them however early they sort. So a tenant
  holding fewer seats than its share (max_num_seqs x weight / the weights of the tenants with
  sequences here) takes the seat of a sequence of a tenant over its share (the newest, of equal or
  lower priority); the preempted sequence is recomputed later, mostly from the prefix cache. A
  tenant within its share is never preempted for another, so two tenants never evict each other.
- Step time. On a CPU a step's time grows with its rows: 128 decode rows take ~7x one of 10. With
  seats alone, a tenant's 10 sequences beside another's 118 run at the speed of 128-row steps.
  So when several tenants have work in a step, the tenant holding the most seats (per unit of
  weight; then the most work: tokens the step could compute for it) is held to half the busiest
  other tenant's level (HELD_LEVEL), and to what the others' work leaves of the step's budget, but
  never below `floor` tokens: its decode rows take turns (least recently stepped first), its
  prefill chunks get what is left. The others are not held, so a tenant with fewer seats runs in
  steps of its own work and at most half as much again (the floor aside), its prefill included.

Example: max_num_seqs 128, budget 2048; tenant A (weight 1) runs 128 sequences, B (weight 1) sends
10 prompts of 130 tokens. Seat shares are 64 each: A's 10 newest sequences give their seats to B's.
A holds the most seats, so A is the one held: in the next step to half B's 1,300 prompt tokens,
650 (its 118 decode rows and 532 tokens of prefill); once B decodes (10 rows), to max(floor 8, 5)
rows a step, in turn, so B's steps carry 18 rows, not 128. Throughput while B is here: that of
18-row steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from pipeline.request.request import Sequence, SequenceStatus

Tenant = str | None
# The held tenant's share of a step: this fraction of the busiest other tenant's tokens (per unit of weight).
# At 1 a tenant beside a flood would run at most 2x slower than alone only if nothing else cost time;
# at 1/2 its steps carry at most half as much again as its own work, which leaves room for the step that
# was running when its requests came and for the flood's preempted sequences' recomputation.
HELD_LEVEL = 0.5


def tenant_of(seq: Sequence) -> Tenant:
    return seq.request.tenant or None


@dataclass(slots=True)
class SeatShares:
    """Seats held beyond the share (`excess`, tenants over it) and seats short of it (`room`)."""

    excess: dict[Tenant, int] = field(default_factory=dict)
    room: dict[Tenant, int] = field(default_factory=dict)

    @property
    def over(self) -> frozenset[Tenant]:
        return frozenset(self.excess)


def seat_shares(running: list[Sequence], waiting: Iterable[Sequence], max_num_seqs: int) -> SeatShares:
    """Each tenant's seats against its share, max_num_seqs x weight / the weights of the tenants with
    sequences here (nothing with one tenant)."""
    weights: dict[Tenant, float] = {}
    held: dict[Tenant, int] = {}
    for seq in running:
        tenant = tenant_of(seq)
        weights[tenant] = seq.request.tenant_weight
        held[tenant] = held.get(tenant, 0) + 1
    for seq in waiting:
        weights.setdefault(tenant_of(seq), seq.request.tenant_weight)
    shares = SeatShares()
    if len(weights) < 2:
        return shares
    total = sum(weights.values())
    for tenant, weight in weights.items():
        share = math.floor(max_num_seqs * weight / total)
        seats = held.get(tenant, 0)
        if seats > share:
            shares.excess[tenant] = seats - share
        elif seats < share:
            shares.room[tenant] = share - seats
    return shares


@dataclass(slots=True)
class StepShares:
    """The tokens a held tenant may still get this step, and which of its decode rows step."""

    tokens_left: dict[Tenant, int] = field(default_factory=dict)
    decode_seq_ids: set[int] = field(default_factory=set)

    def allowed(self, seq: Sequence, num_new: int) -> int:
        """`num_new` cut to what the sequence's tenant may still have this step."""
        tenant = tenant_of(seq)
        if tenant not in self.tokens_left or seq.request.beam_search is not None:
            return num_new  # not held (beams of one search step together: never held)
        if seq.seq_id in self.decode_seq_ids:
            return num_new
        if _is_decode(seq):
            return 0  # its tenant's decode rows this step are others'
        return min(num_new, self.tokens_left[tenant])

    def commit(self, seq: Sequence, num_new: int) -> None:
        tenant = tenant_of(seq)
        if seq.seq_id in self.decode_seq_ids:
            return  # counted when its row was chosen
        if tenant in self.tokens_left and seq.request.beam_search is None:
            self.tokens_left[tenant] = max(0, self.tokens_left[tenant] - num_new)


def _is_decode(seq: Sequence) -> bool:
    """A running sequence with one token to compute (chosen as a row, not given a chunk)."""
    return seq.status is SequenceStatus.RUNNING and seq.num_computed_tokens + 1 == seq.num_tokens


def step_shares(running: list[Sequence], admissible: list[Sequence], budget: int, floor: int) -> StepShares | None:
    """This step's shares; None when nobody is held (fewer than two tenants have work in it, or the held
    one's work fits its share). `admissible`: the waiting sequences that seats are free for this step,
    in admission order; `budget`: the step's tokens."""
    work: dict[Tenant, int] = {}
    weights: dict[Tenant, float] = {}
    for seq in [*running, *admissible]:
        num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
        if num_new > 0:
            tenant = tenant_of(seq)
            work[tenant] = work.get(tenant, 0) + num_new
            weights[tenant] = seq.request.tenant_weight
    if len(work) < 2:
        return None
    seats: dict[Tenant, int] = {}
    for seq in running:
        seats[tenant_of(seq)] = seats.get(tenant_of(seq), 0) + 1

    def served(tenant: Tenant) -> tuple[float, float]:  # seats held, then this step's work, per weight
        return seats.get(tenant, 0) / weights[tenant], work[tenant] / weights[tenant]

    *_, runner_up, held = sorted(work, key=served)
    if served(held) == served(runner_up):
        return None  # two tied at the top: neither is held
    others = sum(work.values()) - work[held]
    next_level = max(work[tenant] / weights[tenant] for tenant in work if tenant != held)
    # Below the others' level, and never taking budget the others' work could use in this step.
    cap = max(floor, min(math.ceil(weights[held] * next_level * HELD_LEVEL), budget - min(others, budget)))
    if work[held] <= cap:
        return None  # its work fits its share
    shares = StepShares({held: cap})
    _choose_decode_rows(running, shares)
    return shares


def _choose_decode_rows(running: list[Sequence], shares: StepShares) -> None:
    """Each held tenant's decode rows up to its tokens, least recently stepped first; what is left
    of its tokens goes to its prefill chunks."""
    decodes: dict[Tenant, list[Sequence]] = {}
    for seq in running:
        tenant = tenant_of(seq)
        if tenant in shares.tokens_left and _is_decode(seq):
            decodes.setdefault(tenant, []).append(seq)
    for tenant, seqs in decodes.items():
        seqs.sort(key=lambda seq: seq.last_scheduled_step)
        chosen = seqs[:shares.tokens_left[tenant]]
        shares.decode_seq_ids.update(seq.seq_id for seq in chosen)
        shares.tokens_left[tenant] -= len(chosen)
