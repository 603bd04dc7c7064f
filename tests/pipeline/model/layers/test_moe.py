"""The mixture-of-experts MLP: routing, and the grouped expert computation against a per-token reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pipeline.model.layers import moe
from pipeline.model.layers.moe import SparseMoE, grouped_experts, route

HIDDEN, INTERMEDIATE, NUM_EXPERTS = 16, 24, 5


def _naive_experts(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, expert_ids: torch.Tensor,
                   weights: torch.Tensor) -> torch.Tensor:
    """One token at a time, one chosen expert at a time: the definition."""
    out = torch.zeros_like(x)
    for token in range(x.shape[0]):
        for slot in range(expert_ids.shape[1]):
            expert = int(expert_ids[token, slot])
            gate, up = (gate_up[expert] @ x[token]).chunk(2)
            out[token] += weights[token, slot] * (down[expert] @ (F.silu(gate) * up))
    return out


def _random_case(num_tokens: int, top_k: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, HIDDEN, generator=generator)
    gate_up = torch.randn(NUM_EXPERTS, 2 * INTERMEDIATE, HIDDEN, generator=generator) * HIDDEN**-0.5
    down = torch.randn(NUM_EXPERTS, HIDDEN, INTERMEDIATE, generator=generator) * INTERMEDIATE**-0.5
    logits = torch.randn(num_tokens, NUM_EXPERTS, generator=generator)
    weights, expert_ids = route(logits, top_k)
    return x, gate_up, down, expert_ids, weights


@pytest.mark.parametrize("use_grouped_mm", [True, False])
@pytest.mark.parametrize(("num_tokens", "top_k"), [(1, 2), (7, 1), (37, 2), (64, 3)])
def test_grouped_experts_equal_the_per_token_reference(monkeypatch: pytest.MonkeyPatch, use_grouped_mm: bool,
                                                       num_tokens: int, top_k: int) -> None:
    if use_grouped_mm and not hasattr(F, "grouped_mm"):
        pytest.skip("this torch has no torch.nn.functional.grouped_mm")
    monkeypatch.setattr(moe, "_has_grouped_mm", lambda rows: use_grouped_mm)
    x, gate_up, down, expert_ids, weights = _random_case(num_tokens, top_k, seed=num_tokens)
    ours = grouped_experts(x, gate_up, down, expert_ids, weights)
    torch.testing.assert_close(ours, _naive_experts(x, gate_up, down, expert_ids, weights), rtol=1e-5, atol=1e-5)


def test_experts_no_token_picked_are_skipped() -> None:
    x, gate_up, down, _, _ = _random_case(6, 2, seed=3)
    expert_ids = torch.tensor([[4, 1]] * 6)  # experts 0, 2 and 3 get no rows
    weights = torch.full((6, 2), 0.5)
    ours = grouped_experts(x, gate_up, down, expert_ids, weights)
    torch.testing.assert_close(ours, _naive_experts(x, gate_up, down, expert_ids, weights), rtol=1e-5, atol=1e-5)


def test_routing_renormalises_the_top_k_softmax_in_float32() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 3.0, 1.0]], dtype=torch.bfloat16)
    weights, expert_ids = route(logits, 2)
    assert weights.dtype == torch.float32
    assert expert_ids.tolist() == [[0, 1], [2, 3]]
    probs = torch.softmax(logits.float(), dim=-1)
    expected = probs.gather(1, expert_ids)
    torch.testing.assert_close(weights, expected / expected.sum(dim=-1, keepdim=True))
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(2))


def test_sparse_moe_block_routes_with_its_gate() -> None:
    torch.manual_seed(0)
    block = SparseMoE(HIDDEN, INTERMEDIATE, NUM_EXPERTS, top_k=2)
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(torch.randn(param.shape) * param.shape[-1] ** -0.5)
        x = torch.randn(9, HIDDEN)
        weights, expert_ids = route(x @ block.gate.weight.T, 2)
        expected = _naive_experts(x, block.experts.gate_up_proj, block.experts.down_proj, expert_ids, weights)
        torch.testing.assert_close(block(x), expected, rtol=1e-5, atol=1e-5)


def test_top_k_outside_the_experts_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"num_experts_per_tok must be in 1\.\.4, got 5"):
        SparseMoE(HIDDEN, INTERMEDIATE, num_experts=4, top_k=5)
