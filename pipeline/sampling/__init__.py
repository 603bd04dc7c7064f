"""Sampling: logits -> tokens, in the order of docs/sampling.md (bans and bias, penalties, DRY,
truncation, reshaping, temperature, the choice of token, logprobs), with counter-based randomness
(`rng`) so results survive batching, preemption and crashes.

May import: pipeline.request, pipeline.step, pipeline.config, pipeline.host_to_device.
"""
