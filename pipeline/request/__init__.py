"""The request and what it carries: `Request`/`Sequence` state, `SamplingParams` and their checks,
the checks on untrusted input, the engine's output records, beam-search state, image placeholders.

Plain data: imports nothing else from pipeline/ (no stage package, no torch).
"""
