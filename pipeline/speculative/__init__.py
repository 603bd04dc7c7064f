"""Speculative decoding by prompt lookup: drafting (ngram.py) and per-sequence draft lengths (adaptive.py).
Verification lives with the scheduler (pipeline/scheduling/speculation.py); docs/speculative.md."""
