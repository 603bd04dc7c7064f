"""Admission: waiting sequences started (waiting -> running) with a chunk of a step's budget.

Under fcfs, and after the running sequences under priority, `_schedule_waiting` starts the waiting
queue's head while budget, seats (`max_num_seqs`) and KV blocks last; a head whose adapter has no
slot is skipped for this step. Under the priority policy `_admit_more_urgent` also runs before each
running sequence gets its budget: waiting sequences of a more urgent (aged) priority start first,
inserted ahead of it, and take the seat or the blocks of the least urgent running sequence when
there are none. Fair share between tenants orders the queue but never preempts.
"""

from __future__ import annotations

import enum

from pipeline.config import SchedulerConfig
from pipeline.request.request import Sequence, SequenceStatus
from pipeline.scheduling.adapter_gate import AdapterGate
from pipeline.scheduling.kv_cache_manager import KVCacheManager
from pipeline.scheduling.waiting_queue import WaitingQueue, aged_priority
from pipeline.step.plan import NewSequence, StepPlan


class Admit(enum.Enum):
    ADMITTED = "admitted"
    NEXT = "next"  # the head left the queue without starting (skipped or ended): try the next one
    BLOCKED = "blocked"  # the head cannot start now (no budget, no blocks, a step in flight)


class WaitingAdmission:
    """The Scheduler's admission steps, kept apart from its step loop (Scheduler inherits them and
    owns the state; `_preempt`, `_commit`, `_bulk_capped` and the adapter checks are the Scheduler's)."""

    config: SchedulerConfig
    kv_cache: KVCacheManager
    adapters: AdapterGate | None
    waiting: WaitingQueue
    running: list[Sequence]

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
        if not self._adapter_can_run(seq):
            skipped.append(self.waiting.pop_head())
            return budget, Admit.NEXT
        cached_block_ids = self.kv_cache.find_cached_prefix(seq)
        num_cached = len(cached_block_ids) * self.kv_cache.block_size
        num_new = seq.num_tokens - num_cached
        if num_new > budget and not self.config.enable_chunked_prefill:
            return budget, Admit.BLOCKED
        num_new = min(num_new, budget)
        if self.config.enable_chunked_prefill:
            num_new = self._bulk_capped(seq, num_new)
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

