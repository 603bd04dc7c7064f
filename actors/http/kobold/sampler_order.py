"""Kobold's `sampler_order` against the order our sampler applies its stages in (docs/sampling.md).

Kobold numbers seven samplers and applies them in the order the client lists. Ours has one order:
repetition penalty (stage 2), then top-k, top-a and top-p on one distribution (stage 4), tail-free (5),
typical (8), temperature (11). A client's order is honoured when, among the samplers its request
switches on, no two that give different results in different orders are listed against ours.
Pairs that commute anyway: repetition penalty and temperature (both scale a logit, by factors of
the same sign), top-k and temperature (temperature keeps the ranking), and, for a greedy request,
every truncation with temperature (each keeps the top token, which greedy picks).
"""

from __future__ import annotations

from typing import Any

TOP_K, TOP_A, TOP_P, TFS, TYPICAL, TEMPERATURE, REP_PEN = range(7)
NAMES = {TOP_K: "top_k", TOP_A: "top_a", TOP_P: "top_p", TFS: "tfs", TYPICAL: "typical",
         TEMPERATURE: "temperature", REP_PEN: "rep_pen"}
# Our stage of each Kobold sampler; top-k, top-a and top-p share one (they cut one distribution).
_OUR_STAGE = {REP_PEN: 2, TOP_K: 4, TOP_A: 4, TOP_P: 4, TFS: 5, TYPICAL: 8, TEMPERATURE: 11}
OUR_ORDER = (REP_PEN, TOP_K, TOP_A, TOP_P, TFS, TYPICAL, TEMPERATURE)  # [6, 0, 1, 2, 3, 4, 5]
_TRUNCATIONS = frozenset({TOP_K, TOP_A, TOP_P, TFS, TYPICAL})


def check_sampler_order(order: Any, params: dict[str, Any]) -> None:
    """ValueError naming sampler_order when `order` is not a permutation of 0-6, or when it puts two
    samplers this request uses in an order our sampler cannot follow. `params` are our (mapped) ones."""
    if order is None:
        return
    if (not isinstance(order, list) or any(not isinstance(i, int) or isinstance(i, bool) for i in order)
            or sorted(order) != list(range(7))):
        raise ValueError(f"sampler_order must list each of the samplers 0-6 once, got {order!r}")
    active = _active(params)
    greedy = TEMPERATURE not in active and _is_greedy(params)
    used = [sampler for sampler in order if sampler in active or (greedy and sampler == TEMPERATURE)]
    for position, first in enumerate(used):
        for later in used[position + 1:]:
            if _OUR_STAGE[later] < _OUR_STAGE[first] and not _commute(first, later, greedy):
                raise ValueError(
                    f"sampler_order puts {NAMES[first]} ({first}) before {NAMES[later]} ({later}), and this "
                    f"request uses both; this server applies rep_pen, then top_k/top_a/top_p, tfs, typical "
                    f"and temperature last: send sampler_order {list(OUR_ORDER)} (or leave it out)")


def _active(params: dict[str, Any]) -> set[int]:
    """The Kobold samplers that change something for this request (our defaults switch each off)."""
    active = set()
    if params.get("top_k", -1) not in (-1, None):
        active.add(TOP_K)
    checks = ((TOP_A, "top_a", lambda v: v > 0), (TOP_P, "top_p", lambda v: v < 1), (TFS, "tfs", lambda v: v < 1),
              (TYPICAL, "typical_p", lambda v: v < 1), (REP_PEN, "repetition_penalty", lambda v: v != 1))
    for sampler, name, switched_on in checks:
        value = params.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and switched_on(value):
            active.add(sampler)
    if not _is_greedy(params) and (params.get("temperature", 1.0) != 1 or params.get("dynatemp_max")):
        active.add(TEMPERATURE)
    return active


def _is_greedy(params: dict[str, Any]) -> bool:
    temperature = params.get("temperature", 1.0)
    return isinstance(temperature, int | float) and temperature < 1e-5 and not params.get("dynatemp_max")


def _commute(first: int, later: int, greedy: bool) -> bool:
    pair = {first, later}
    if TEMPERATURE not in pair:
        return False
    other = (pair - {TEMPERATURE}).pop()
    if greedy:
        return other in _TRUNCATIONS  # each keeps the top token; repetition penalty may change which it is
    return other in (REP_PEN, TOP_K)
