"""Admission: waiting sequences started (waiting -> running) with a chunk of a step's budget.

Under fcfs, and after the running sequences under priority, `_schedule_waiting` starts the waiting
queue's head while budget, seats (`max_num_seqs`) and KV blocks last; a head whose adapter has no
slot is skipped for this step. Under the priority policy `_admit_more_urgent` also runs before each
running sequence gets its budget: waiting sequences of a more urgent (aged) priority start first,
inserted ahead of it, and take the seat or the blocks of the least urgent running sequence when
there are none. Fair share between tenants orders the queue; a tenant under its seat share also takes
the seats of a tenant over it (`_take_fair_seats`, tenant_shares.py), and never the other way round.
"""

from __future__ import annotations

import enum
import itertools

from pipeline.config import SchedulerConfig
from pipeline.request.request import Sequence, SequenceStatus
from pipeline.scheduling.adapter_gate import AdapterGate
from pipeline.scheduling.kv_cache_manager import KVCacheManager
from pipeline.scheduling.tenant_shares import SeatShares, StepShares, Tenant, seat_shares, step_shares, tenant_of
from pipeline.scheduling.waiting_queue import WaitingQueue, aged_priority
from pipeline.step.plan import NewSequence, StepPlan


class Admit(enum.Enum):
    ADMITTED = "admitted"
    NEXT = "next"  # the head left the queue without starting (skipped or ended): try the next one
    BLOCKED = "blocked"  # the head cannot start now (no budget, no blocks, a step in flight)


class WaitingAdmission:
    """The Scheduler's admission steps, kept apart from its step loop (Scheduler inherits them and
    owns the state; `_preempt`, `_commit`, `_step_capped` and the adapter checks are the Scheduler's)."""

    config: SchedulerConfig
    kv_cache: KVCacheManager
    adapters: AdapterGate | None
    waiting: WaitingQueue
    running: list[Sequence]
    _step_shares: StepShares | None
    _seats_reserved: dict[Tenant, int]

    def _share_between_tenants(self, plan: StepPlan, budget: int) -> None:
        """Priority policy, at the start of a step: order by seat shares, let tenants under theirs take
        seats from those over, then fix what each tenant may compute in this step (tenant_shares.py)."""
        seats = seat_shares(self.running, self.waiting, self.config.max_num_seqs)
        self.waiting.over_share = seats.over
        self.waiting.settle(plan.step_id)
        self.running.sort(key=self.waiting.running_key)  # stable; preemption takes running[-1]
        self._seats_reserved = self._take_fair_seats(plan, seats) if seats.room else {}
        self._step_shares = None
        if self.config.fair_step_tokens is not None:
            free_seats = max(0, self.config.max_num_seqs - len(self.running))
            admissible = list(itertools.islice(self.waiting, free_seats))
            self._step_shares = step_shares(self.running, admissible, budget, self.config.fair_step_tokens)

    def _take_fair_seats(self, plan: StepPlan, seats: SeatShares) -> dict[Tenant, int]:
        """Seats reserved this step for the waiting sequences of tenants under their share, in admission
        order: free ones first, then the seat of the newest running sequence of a tenant over its share,
        of equal or lower priority (it sorts last: the running order puts over-share tenants last at
        each priority). Returns the seats reserved per tenant (`_seat_reserved_for_others` keeps
        other tenants' heads out of them)."""
        reserved: dict[Tenant, int] = {}
        free_seats = self.config.max_num_seqs - len(self.running)
        most_urgent = self.waiting.aged_priority(self.waiting.head()) if self.waiting else 0
        for seq in list(self.waiting):
            if self.waiting.aged_priority(seq) != most_urgent:
                break  # seats are shared at the most urgent priority waiting; a more urgent one is never held back
            tenant = tenant_of(seq)
            if seats.room.get(tenant, 0) <= 0 or seq.has_placeholder:
                continue
            if free_seats <= 0:
                victim = self.running[-1] if self.running else None
                if (victim is None or seats.excess.get(tenant_of(victim), 0) <= 0
                        or aged_priority(victim) < self.waiting.aged_priority(seq)):
                    break
                seats.excess[tenant_of(victim)] -= 1
                self._preempt(victim, plan)
                free_seats += 1
            seats.room[tenant] -= 1
            reserved[tenant] = reserved.get(tenant, 0) + 1
            free_seats -= 1
        return reserved

    def _seat_reserved_for_others(self, seq: Sequence) -> bool:
        """Whether the free seats left are all reserved for other tenants' sequences (and take one)."""
        if not self._seats_reserved:
            return False
        tenant = tenant_of(seq)
        mine = self._seats_reserved.get(tenant, 0)
        if mine > 0:
            self._seats_reserved[tenant] = mine - 1
            return False
        free_seats = self.config.max_num_seqs - len(self.running)
        return free_seats <= sum(self._seats_reserved.values())

    def _schedule_waiting(self, plan: StepPlan, budget: int) -> None:
        skipped: list[Sequence] = []  # their adapter has no slot now: later ones may still start
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            budget, outcome = self._admit_head(plan, budget, len(self.running), skipped)
            if outcome is Admit.BLOCKED:
                break
        self.waiting.return_skipped(skipped)

    def _admit_more_urgent(self, plan: StepPlan, budget: int, index: int) -> tuple[int, int]:
        """Priority policy, before running[index] gets budget: admit the waiting sequences of a more
        urgent priority than it (inserted at `index`), taking the place of the least urgent running sequence
        when seq slots or blocks run out. That one sorts at or after running[index]: it is not yet
        scheduled in this plan. Preempted, it goes back to the waiting queue behind `head`."""
        skipped: list[Sequence] = []
        num_admitted = 0
        while self.waiting and budget > 0 and index + num_admitted < len(self.running):
            head = self.waiting.head()
            # Priority alone: a tenant's fair share orders admission but never preempts (waiting_queue.urgency).
            if self.waiting.aged_priority(head) >= aged_priority(self.running[index + num_admitted]):
                break
            if len(self.running) >= self.config.max_num_seqs:
                self._preempt(self.running[-1], plan)
                continue
            budget, outcome = self._admit_head(plan, budget, index + num_admitted, skipped)
            if outcome is Admit.ADMITTED:
                num_admitted += 1
            elif outcome is Admit.BLOCKED:
                if head.has_placeholder or not self._blocks_short(head, budget):
                    break
                self._preempt(self.running[-1], plan)  # free its blocks, then try again
        self.waiting.return_skipped(skipped)
        return budget, num_admitted

    def _blocks_short(self, seq: Sequence, budget: int) -> bool:
        """Whether `seq` was refused for want of KV blocks (rather than of budget, unchunked)."""
        return self.config.enable_chunked_prefill or seq.num_tokens <= budget

    def _admit_head(self, plan: StepPlan, budget: int, position: int,
                    skipped: list[Sequence]) -> tuple[int, Admit]:
        """Start the waiting queue's head at running[position] with a chunk of `budget`."""
        seq = self.waiting.head()
        if seq.has_placeholder:  # preempted while a step samples its next token: wait for it
            return budget, Admit.BLOCKED
        if not self._adapter_servable(seq):
            return budget, Admit.NEXT  # it ended with an error
        if not self._adapter_can_run(seq) or self._seat_reserved_for_others(seq):
            skipped.append(self.waiting.set_aside_head())
            return budget, Admit.NEXT
        cached_block_ids = self.kv_cache.find_cached_prefix(seq)
        num_cached = len(cached_block_ids) * self.kv_cache.block_size
        num_new = seq.num_tokens - num_cached
        if num_new > budget and not self.config.enable_chunked_prefill:
            return budget, Admit.BLOCKED
        num_new = min(num_new, budget)
        if self.config.enable_chunked_prefill:
            if self._step_shares is not None and self._step_shares.allowed(seq, num_new) == 0:
                skipped.append(self.waiting.set_aside_head())  # its tenant had its share of this step
                return budget, Admit.NEXT
            num_new = self._step_capped(seq, num_new)
            if num_new == 0:  # bulk prefill past this step's share: starts next step
                return budget, Admit.BLOCKED
        if not self.kv_cache.allocate(seq, num_new, cached_block_ids):
            return budget, Admit.BLOCKED
        self.waiting.pop_head()
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = num_cached
        seq.num_computed_tokens = num_cached
        seq.status = SequenceStatus.RUNNING
        self.running.insert(position, seq)
        if self.adapters is not None:
            self.adapters.acquire(seq)
        plan.new_sequences.append(describe_new(seq))
        self._commit(seq, num_new, plan)
        return budget - num_new, Admit.ADMITTED


def describe_new(seq: Sequence) -> NewSequence:
    """What tensor prep needs of a sequence it has not seen (or sees again after a preemption)."""
    params = seq.params
    eos = () if params.ignore_eos else tuple(sorted(seq.request.eos_token_ids))
    return NewSequence(
        seq_id=seq.seq_id,
        token_ids=list(seq.token_ids),
        num_prompt_tokens=seq.num_prompt_tokens,
        block_ids=list(seq.block_ids),
        num_computed_tokens=seq.num_computed_tokens,
        params=params,
        seed=seq.request.seed,
        choice_index=seq.choice_index,
        stop_token_ids=tuple(dict.fromkeys(eos + tuple(params.stop_token_ids))),
        mirostat_mu=seq.mirostat_mu,
        lora_slot=-1 if seq.lora_slot is None else seq.lora_slot,
        images=seq.request.images,
    )

