"""The scheduler: one rule for prefill and decode (docs/design.md §4).

Each sequence has `num_computed_tokens`; a step hands sequences tokens under a token budget
(`max_num_batched_tokens`) and a sequence cap (`max_num_seqs`): running sequences first, then
waiting ones in FCFS order. A long prompt simply gets a chunk of the budget per step while
decodes keep running beside it. When KV blocks run out, the newest running sequence is
preempted: its blocks are freed and it is recomputed later (its prefix may still be cached).

Under the priority policy (waiting_queue.py) the same rule runs in order of urgency: running and
waiting sequences are merged by priority, so a waiting sequence of a more urgent priority than a
running one is admitted before that one gets budget, and takes the place (seq slot or KV blocks)
of the least urgent running sequence when there is no other (admission.py); preemption picks the least urgent
(by priority, then tenant fair share, then arrival). Fair share (fair_share.py) only orders admission.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import SchedulerConfig
from pipeline.grammar.compiler import GrammarCompiler
from pipeline.request.outputs import PromptLogprobsEvent, StopStringFinish, TokenEvent, TokenLogprob
from pipeline.request.request import FinishReason, Request, Sequence, SequenceStatus
from pipeline.scheduling.adapter_gate import AdapterGate
from pipeline.scheduling.admission import WaitingAdmission
from pipeline.scheduling.beam_scheduling import BeamStep, new_beam_search, on_beam_candidates
from pipeline.scheduling.failures import FailedRequests, RequestFailure
from pipeline.scheduling.grammar_masks import token_bitmasks
from pipeline.scheduling.kv_cache_manager import KVCacheManager
from pipeline.scheduling.lookahead import add_placeholders, drop_placeholder, fill_placeholder
from pipeline.scheduling.stop_checks import check_stop
from pipeline.scheduling.tenant_shares import StepShares
from pipeline.scheduling.waiting_queue import WaitingQueue
from pipeline.speculative.speculator import Speculator
from pipeline.step.plan import RunningSequence, StepPlan
from pipeline.step.result import StepResult


@dataclass(frozen=True, slots=True)
class SchedulerFeatures:
    """What a scheduler serves beyond plain requests; each None when off."""

    adapters: AdapterGate | None = None  # LoRA
    grammars: GrammarCompiler | None = None  # structured outputs
    speculator: Speculator | None = None  # speculative decoding


class Scheduler(WaitingAdmission):
    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager, max_model_len: int,
                 features: SchedulerFeatures = SchedulerFeatures()) -> None:
        self.config = config
        self.adapters = features.adapters
        self.grammars = features.grammars
        self.speculator = features.speculator
        self.failures = FailedRequests()
        self.kv_cache = kv_cache
        # A sequence must fit in the whole cache, or it could only preempt itself forever; under a
        # sliding window it holds a bounded number of blocks however long it grows.
        blocks_per_seq = kv_cache.max_blocks_per_sequence(config.max_num_batched_tokens)
        if blocks_per_seq is None or blocks_per_seq > kv_cache.pool.num_blocks:
            max_model_len = min(max_model_len, kv_cache.pool.num_blocks * kv_cache.block_size)
        self.max_model_len = max_model_len
        self._bulk_prefill_left: int | None = None  # this step's share left (see _step_capped)
        self._step_shares: StepShares | None = None  # what each tenant may compute this step
        self._last_plan_tokens = 0  # tokens of the last plan made (see plan_ahead_max_tokens)
        self.plan_ahead_max_tokens: int | None = None  # no plan ahead of a longer step (lookahead.py; CPUs)
        self._seats_reserved: dict[str | None, int] = {}  # free seats kept this step for tenants under their share
        self.waiting = WaitingQueue(config.scheduling_policy, config.priority_aging_steps,
                                    prefill_order=config.prefill_order)
        self.by_priority = self.waiting.by_priority
        self.running: list[Sequence] = []
        self.sequences: dict[int, Sequence] = {}
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self.num_generated_tokens = 0
        # Output tokens per tenant since the last take_tenant_tokens() (the worker's per-tenant metric):
        # bounded by the tenants that generated in between, not by every tenant ever seen.
        self.tenant_tokens: dict[str | None, int] = {}
        self._removed_seq_ids: list[int] = []
        self._next_step_id = 0

    # ---- requests in and out -------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.lora_id is not None and self.adapters is None:
            raise ValueError(f"lora: adapter {request.lora_name!r} requested but LoRA is not enabled")
        if request.num_prompt_tokens >= self.max_model_len:
            raise ValueError(f"prompt has {request.num_prompt_tokens} tokens; the limit is "
                             f"{self.max_model_len - 1} (max_model_len {self.max_model_len} incl. one output)")
        self.requests[request.request_id] = request
        if request.params.use_beam_search:
            request.beam_search = new_beam_search(request, self.max_model_len)
        for seq in request.sequences:
            if not seq.is_finished:  # a resumed request may have finished choices
                self.sequences[seq.seq_id] = seq
                self.waiting.add(seq, self._next_step_id)

    def finish_sequence(self, seq: Sequence, reason: FinishReason, stop_reason: int | str | None = None) -> None:
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self._release_adapter(seq)
            self._removed_seq_ids.append(seq.seq_id)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv_cache.free(seq)
        drop_placeholder(seq)
        seq.draft_token_ids = []
        if self.speculator is not None:
            self.speculator.forget(seq.seq_id)
        seq.finish(reason, stop_reason)
        del self.sequences[seq.seq_id]
        if seq.request.is_finished:
            self.requests.pop(seq.request.request_id, None)

    def abort_request(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> list[TokenEvent]:
        """End every unfinished choice of a request (cancel, deadline); events for the Output stage."""
        request = self.requests.get(request_id)
        if request is None:
            return []
        ended = [seq.choice_index for seq in request.sequences if not seq.is_finished]
        for seq in list(request.sequences):
            self.finish_sequence(seq, reason)
        if request.beam_search is not None:
            ended = list(range(request.params.n))  # the client's choices, not the running beams
        return [TokenEvent(request_id, index, None, finish_reason=str(reason)) for index in ended]

    def add_forks(self, forks: list[Sequence]) -> None:
        """New beams of a beam search: first in line, as they continue a running request."""
        for seq in reversed(forks):
            self.sequences[seq.seq_id] = seq
            self.waiting.put_back(seq, self._next_step_id)

    def finish_by_stop_string(self, finish: StopStringFinish) -> None:
        request = self.requests.get(finish.request_id)
        if request is not None:
            self.finish_sequence(request.sequences[finish.choice_index], FinishReason.STOP, finish.stop_string)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step ----------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        plan = StepPlan(step_id=self._next_step_id, removed_seq_ids=self._removed_seq_ids)
        self._next_step_id += 1
        self._removed_seq_ids = []
        budget = self.config.max_num_batched_tokens
        self._bulk_prefill_left = self.config.max_bulk_prefill_tokens if self.by_priority else None
        if self.by_priority:
            self._share_between_tenants(plan, budget)
        else:
            self.waiting.settle(plan.step_id)
        budget, preempted = self._schedule_running(plan, budget)
        if not preempted:
            self._schedule_waiting(plan, budget)
        while not plan.num_scheduled_tokens and self.waiting and self.running:
            # Only beam search gets here: the running beams are parked (they have their candidates)
            # and a fork cannot get blocks. Parked beams keep their candidates when recomputed later.
            self._preempt(self.running[-1], plan, to_front=False)
            self._schedule_waiting(plan, budget)
        if self.adapters is not None:
            plan.lora_loads = self.adapters.slots.take_loads()
        self._add_token_bitmasks(plan)
        if plan.is_empty:  # not sent: the next plan tells tensor prep of the removed rows
            self._removed_seq_ids = plan.removed_seq_ids + self._removed_seq_ids
        self._last_plan_tokens = sum(plan.num_scheduled_tokens.values())
        return plan

    def _add_token_bitmasks(self, plan: StepPlan) -> None:
        scheduled = [self.sequences[seq_id] for seq_id in plan.num_scheduled_tokens]
        plan.token_bitmasks, failed = token_bitmasks(scheduled, self.grammars, self.max_model_len)
        for seq, message in failed:  # only where the grammar was not compiled at intake (another process)
            request = seq.request
            self.abort_request(request.request_id, FinishReason.ERROR)
            self.failures.add(request.request_id, "invalid_request", message)
            plan.num_scheduled_tokens.pop(seq.seq_id, None)

    def schedule_ahead(self) -> StepPlan | None:
        """The next plan while a step is still running (pipeline/scheduling/lookahead.py); None when a
        sequence of the running step needs its result before it can be planned."""
        if self.plan_ahead_max_tokens is not None and self._last_plan_tokens > self.plan_ahead_max_tokens:
            return None  # a long step: requests arriving during it may join the next
        if self.speculator is not None and self.speculator.holds_back_lookahead(self.running):
            return None
        if not add_placeholders(self.running, self.max_model_len):
            return None
        return self.schedule()

    def _schedule_running(self, plan: StepPlan, budget: int) -> tuple[int, bool]:
        preempted = False
        index = 0
        if self.speculator is not None and self.speculator.active(len(self.running)):
            self.speculator.prefetch(self.running, budget, self.max_model_len)
        while index < len(self.running) and budget > 0:
            if self.by_priority and not preempted:
                budget, num_admitted = self._admit_more_urgent(plan, budget, index)
                index += num_admitted
                if index >= len(self.running) or budget <= 0:
                    break
            seq = self.running[index]
            num_new = self._step_capped(seq, min(seq.num_tokens - seq.num_computed_tokens, budget))
            if num_new == 0:  # a beam waiting for its siblings' candidates (only beam search parks), or
                index += 1    # bulk prefill past this step's share, or its tenant's share of the step
                continue
            num_blocks_before = len(seq.block_ids)
            draft = self._draft(seq, budget)
            while not draft and not self.kv_cache.allocate(seq, num_new):
                preempted = True
                victim = self.running[-1]
                self._preempt(victim, plan)
                if victim is seq:
                    return budget, preempted
            plan.running_sequences.append(RunningSequence(
                seq_id=seq.seq_id,
                new_token_ids=seq.token_ids[seq.num_sent_tokens:],
                new_block_ids=seq.block_ids[num_blocks_before:],
                num_computed_tokens=seq.num_computed_tokens,
                mirostat_mu=seq.mirostat_mu,
                token_start=seq.num_sent_tokens,
                draft_token_ids=draft,
                block_start=num_blocks_before,
            ))
            self._commit(seq, num_new, plan)
            seq.draft_token_ids = draft
            plan.num_scheduled_tokens[seq.seq_id] += len(draft)
            budget -= num_new + len(draft)
            index += 1
        return budget, preempted

    def _draft(self, seq: Sequence, budget: int) -> list[int]:
        """A decoding sequence's draft, with blocks allocated for its last token and the draft;
        [] (nothing allocated) when it has none or the blocks for it are not free."""
        if self.speculator is None or not self.speculator.active(len(self.running)):
            return []
        draft = self.speculator.draft(seq, budget, self.max_model_len)
        if draft and self.kv_cache.allocate(seq, 1 + len(draft)):
            return draft
        return []

    # ---- LoRA adapters -------------------------------------------------------------------------

    def _adapter_servable(self, seq: Sequence) -> bool:
        """False (and the request ends with an error) when its adapter failed to load."""
        if self.adapters is None or not self.adapters.failed(seq):
            return True
        request = seq.request
        self.abort_request(request.request_id, FinishReason.ERROR)
        self.failures.add(request.request_id, "lora_unavailable", f"lora: adapter {request.lora_name!r} failed to load")
        return False

    def _adapter_can_run(self, seq: Sequence) -> bool:
        return self.adapters is None or self.adapters.can_run(seq)

    def _release_adapter(self, seq: Sequence) -> None:
        if self.adapters is not None:
            self.adapters.release(seq)

    def take_failures(self) -> list[RequestFailure]:
        return self.failures.take()

    def _step_capped(self, seq: Sequence, num_new: int) -> int:
        """`num_new` within long_prefill_token_threshold (a prompt chunk's cap), what the sequence's tenant
        may still compute this step (tenant_shares.py) and, for a bulk request's prefill chunk, what is
        left of the step's bulk prefill share (max_bulk_prefill_tokens)."""
        threshold = self.config.long_prefill_token_threshold
        if threshold:
            num_new = min(num_new, threshold)
        if self._step_shares is not None:
            num_new = self._step_shares.allowed(seq, num_new)
        if self._bulk_prefill_left is None or num_new <= 1 or seq.request.priority <= 0:
            return num_new
        return min(num_new, self._bulk_prefill_left)

    def _commit(self, seq: Sequence, num_new: int, plan: StepPlan) -> None:
        if self._bulk_prefill_left is not None and num_new > 1 and seq.request.priority > 0:
            self._bulk_prefill_left -= num_new
        if self._step_shares is not None:
            self._step_shares.commit(seq, num_new)
        seq.last_scheduled_step = plan.step_id
        plan.num_scheduled_tokens[seq.seq_id] = num_new
        seq.num_computed_tokens += num_new
        seq.num_sent_tokens = seq.num_tokens

    def _preempt(self, seq: Sequence, plan: StepPlan, to_front: bool = True) -> None:
        self.running.remove(seq)
        self._release_adapter(seq)
        self.kv_cache.free(seq)
        seq.status = SequenceStatus.PREEMPTED
        seq.num_computed_tokens = 0
        seq.draft_token_ids = []
        seq.num_preemptions += 1
        self.num_preemptions += 1
        plan.removed_seq_ids.append(seq.seq_id)
        if to_front:
            self.waiting.put_back(seq, self._next_step_id)
        else:
            self.waiting.add(seq, self._next_step_id)

    # ---- results -----------------------------------------------------------------------------

    def apply_step_result(self, result: StepResult) -> list[TokenEvent | PromptLogprobsEvent]:
        """Append the sampled tokens, apply stop tokens and length limits; events for Output."""
        events: list[TokenEvent | PromptLogprobsEvent] = []
        for seq_id, entries in result.prompt_logprobs.items():
            seq = self.sequences.get(seq_id)
            if seq is not None and seq.choice_index == 0:  # every choice scores the same prompt
                events.append(PromptLogprobsEvent(seq.request.request_id, entries))
        for seq_id, rows in result.rows_by_sequence():
            seq = self.sequences.get(seq_id)
            if seq is None:
                continue  # ended (aborted, stop string) while the step was running
            if seq.request.beam_search is not None and rows[0][1] is not None:
                events.extend(self._apply_beam_step(seq.request, on_beam_candidates(seq, rows[0][1])))
                continue
            if seq.params.max_tokens == 0:
                events.append(self._scored_only(seq))
                continue
            if seq_id in result.mirostat_mu:  # mu belongs to the choice: it survives preemption
                seq.mirostat_mu = result.mirostat_mu[seq_id]
            events.extend(self._apply_sampled_rows(seq, rows))
        return events

    def _apply_sampled_rows(self, seq: Sequence, rows: list[tuple[int, TokenLogprob | None]]) -> list[TokenEvent]:
        """Emit the token of each row while the one before it confirmed the draft (a sequence
        without a draft has one row); then give back the KV of the rejected draft tokens."""
        draft, seq.draft_token_ids = seq.draft_token_ids, []
        events = []
        num_accepted = 0
        for token_id, logprob in rows:
            events.append(self._apply_token(seq, token_id, logprob))
            if seq.is_finished or num_accepted >= len(draft) or token_id != draft[num_accepted]:
                break
            num_accepted += 1
        if draft and self.speculator is not None:
            self.speculator.on_verified(seq, len(draft), num_accepted)
            if not seq.is_finished:  # (a finished sequence freed all its blocks)
                seq.num_computed_tokens += num_accepted
                self.kv_cache.settle_draft(seq)
        return events

    def _apply_token(self, seq: Sequence, token_id: int, logprob: TokenLogprob | None) -> TokenEvent:
        if logprob is not None:
            seq.cumulative_logprob += logprob.logprob
        self.append_token(seq, token_id)
        return TokenEvent(
            seq.request.request_id, seq.choice_index, token_id, logprob,
            finish_reason=str(seq.finish_reason) if seq.finish_reason is not None else None,
            stop_reason=seq.stop_reason, num_cached_tokens=seq.num_cached_tokens,
            mirostat_mu=seq.mirostat_mu, grammar_complete=seq.grammar_complete,
        )

    def _scored_only(self, seq: Sequence) -> TokenEvent:
        """max_tokens 0: the prompt is prefilled (and scored, if prompt_logprobs asked); the token the
        step sampled after it is dropped, and the choice ends with "length" holding no token."""
        self.finish_sequence(seq, FinishReason.LENGTH)
        return TokenEvent(seq.request.request_id, seq.choice_index, None, finish_reason=str(FinishReason.LENGTH),
                          num_cached_tokens=seq.num_cached_tokens)

    def _apply_beam_step(self, request: Request, step: BeamStep) -> list[TokenEvent]:
        self.num_generated_tokens += step.num_generated_tokens
        self._count_tenant_tokens(request, step.num_generated_tokens)
        for beam in step.finished:
            self.finish_sequence(beam, FinishReason.STOP)
        self.add_forks(step.forks)
        return step.events

    def append_token(self, seq: Sequence, token_id: int) -> None:
        """Record a sampled token and finish the sequence if a stop condition holds."""
        if seq.has_placeholder:  # planned ahead: the token takes its placeholder's place
            fill_placeholder(seq, token_id)
        else:
            seq.token_ids.append(token_id)
        self.num_generated_tokens += 1
        self._count_tenant_tokens(seq.request, 1)
        if self.adapters is not None:
            self.adapters.count_token(seq)
        stop = check_stop(seq, token_id, self.max_model_len)
        if stop is not None:
            seq.grammar_complete = seq.grammar_complete or stop.grammar_complete
            self.finish_sequence(seq, stop.reason, stop.stop_reason)

    def _count_tenant_tokens(self, request: Request, count: int) -> None:
        self.tenant_tokens[request.tenant] = self.tenant_tokens.get(request.tenant, 0) + count

    def take_tenant_tokens(self) -> dict[str | None, int]:
        """Output tokens per tenant (None: the default tenant) since the last call."""
        counts, self.tenant_tokens = self.tenant_tokens, {}
        return counts
