"""Tensor prep: a `StepPlan` becomes a `PreparedStep` (model inputs and the sampling batch), built
by numpy gathers over a persistent batch whose rows hold each running sequence's state.

May import: pipeline.request, pipeline.step.
"""
