"""A proposer whose calls run on an executor: a worker routes its draft model through the device
thread (actors/kit/device.py), where every torch call of the worker runs.

The scheduler asks for drafts while it plans a step, and it plans a step with drafts only once the
step before has returned (pipeline/scheduling/lookahead.py): the device thread is idle then, and the
wait is the drafting itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor

from pipeline.speculative.proposer import DraftProposer


class ProposerOnExecutor:
    def __init__(self, proposer: DraftProposer, executor: Executor) -> None:
        self.proposer, self.executor = proposer, executor

    def propose(self, seq_id: int, token_ids: Sequence[int], k: int) -> list[int]:
        return self.executor.submit(self.proposer.propose, seq_id, list(token_ids), k).result()

    def propose_many(self, requests: list[tuple[int, Sequence[int], int]]) -> dict[int, list[int]]:
        requests = [(seq_id, list(token_ids), k) for seq_id, token_ids, k in requests]
        return self.executor.submit(self.proposer.propose_many, requests).result()

    def forget(self, seq_id: int) -> None:
        self.proposer.forget(seq_id)  # bookkeeping only; the scheduler never drafts meanwhile
