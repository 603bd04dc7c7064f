"""Planning a step while the previous one still runs (what vLLM V1 and SGLang call async scheduling).

While step N runs, every sequence that samples in it will most likely want one more decode step.
So the scheduler appends a placeholder for the token N is sampling and plans N + 1 as if it were
known: blocks, positions and the slot for it are all fixed by the length alone. Tensor prep builds
N + 1's inputs with the placeholder as the input id, and the device thread writes N's sampled token
there just before N + 1's forward (actors/worker/stages.py). When N's result reaches the scheduler, the
token takes the placeholder's place (`fill_placeholder`) and the stop rules run as usual; a sequence
that stopped had one wasted row in N + 1, whose result is dropped like any for a finished sequence.

Example: prompt [5, 6, 7], step N computes position 2 and samples. Planning N + 1 makes the tokens
[5, 6, 7, P] and schedules position 3 with input id P; N samples 9; the device runs N + 1 on input
id 9; the scheduler then holds [5, 6, 7, 9].

A placeholder is added only where the sampling of N + 1 does not read N's token other than as the
input id: no penalties, DRY or mirostat (they read the output history or N's mu), no beam search
(N's candidates decide the beams) and no grammar (its mask for N + 1 follows N's token). When such
a sequence is in step N, nothing is planned ahead and the scheduler waits for N, as the plain step
loop does. A sequence that N surely finishes (it reaches max_tokens or the context length) gets no
placeholder and simply sits N + 1 out.

On a CPU nothing is planned ahead of a step of more than PLAN_AHEAD_MAX_TOKENS tokens (prefill): such a
step runs long (2,048 prompt tokens take ~2 s on a 2-core CPU) against the milliseconds planning saves,
and a request arriving during it would otherwise wait for the step planned ahead as well. (On a GPU
the same step takes milliseconds, about what planning does, so every step is planned ahead.)
"""

from __future__ import annotations

from pipeline.request.request import Sequence
from pipeline.request.sampling_params import SamplingParams
from pipeline.step.plan import PLACEHOLDER_TOKEN

PLAN_AHEAD_MAX_TOKENS = 512


def plans_ahead(params: SamplingParams) -> bool:
    """Whether a sequence's next step can be planned before its current token is known."""
    return not (params.needs_penalties or params.uses_mirostat or params.dry_multiplier > 0
                or params.use_beam_search or params.structured_outputs is not None)


def add_placeholders(running: list[Sequence], max_model_len: int) -> bool:
    """Give each running sequence whose token is being sampled a placeholder; False (and nothing
    changed) when one of them cannot be planned ahead."""
    sampling = [seq for seq in running
                if seq.num_computed_tokens == seq.num_tokens and not _finishes_next(seq, max_model_len)]
    if not all(plans_ahead(seq.params) and not seq.has_placeholder for seq in sampling):
        return False  # (a placeholder still unfilled: two steps in flight, one more than planned for)
    for seq in sampling:
        seq.token_ids.append(PLACEHOLDER_TOKEN)
        seq.has_placeholder = True
    return True


def fill_placeholder(seq: Sequence, token_id: int) -> None:
    seq.token_ids[-1] = token_id
    seq.has_placeholder = False
    # Tensor prep may hold the placeholder: the next plan sends the real value again.
    seq.num_sent_tokens = min(seq.num_sent_tokens, seq.num_tokens - 1)


def drop_placeholder(seq: Sequence) -> None:
    """A sequence that ends before its token lands keeps only known tokens."""
    if seq.has_placeholder:
        seq.token_ids.pop()
        seq.has_placeholder = False


def _finishes_next(seq: Sequence, max_model_len: int) -> bool:
    """Whether the token being sampled surely ends the sequence (by length, whatever its value)."""
    max_tokens = seq.params.max_tokens
    return (max_tokens is not None and seq.num_output_tokens + 1 >= max_tokens) \
        or seq.num_tokens + 1 >= max_model_len
