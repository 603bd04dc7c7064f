"""Speculative decoding, all of it (docs/speculative.md): where drafts come from (`proposer`: prompt
lookup over `ngram`, or a small model, `draft_model`, which drafts a step's sequences together), how
long each sequence's drafts are (`adaptive`), the scheduler's side (`speculator`: who drafts, the
draft's budget, verification's bookkeeping), and a proposer run on the device thread (`on_executor`).

May import: pipeline.model (the draft model's runner and loader), pipeline.loading, pipeline.config,
pipeline.request, pipeline.step.
"""
