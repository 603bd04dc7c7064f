"""StepResult: what the Sampling stage sends the Scheduler after a step (plain data, no tensors):
sampled token ids per sequence, their logprobs when asked, and the prompt logprobs computed in
this step. `pipeline/sampling/step_sampling.py` makes it from a step's logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.request.outputs import TokenLogprob


@dataclass(slots=True)
class StepResult:
    step_id: int
    seq_ids: list[int]  # sequences that sampled, in row order
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]  # per row; None where the sequence asked for none
    # seq_id -> entries for the prompt positions scored this step (in prompt order)
    prompt_logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    # seq_id -> mirostat's mu after this step's token, for the choices that use mirostat
    mirostat_mu: dict[int, float] = field(default_factory=dict)

    def rows_by_sequence(self) -> list[tuple[int, list[tuple[int, TokenLogprob | None]]]]:
        """The rows grouped by sequence: a speculating sequence has 1 + k consecutive rows.
        seq_ids [4, 7, 7, 7, 9] -> [(4, [row 0]), (7, [rows 1-3]), (9, [row 4])]."""
        grouped: list[tuple[int, list[tuple[int, TokenLogprob | None]]]] = []
        for seq_id, token_id, logprob in zip(self.seq_ids, self.token_ids, self.logprobs, strict=True):
            if grouped and grouped[-1][0] == seq_id:
                grouped[-1][1].append((token_id, logprob))
            else:
                grouped.append((seq_id, [(token_id, logprob)]))
        return grouped
