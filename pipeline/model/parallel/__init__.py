"""Tensor parallelism: the rank processes and their collectives (`group`: gloo on CPU, NCCL on CUDA)
and how a model's layers are split over the ranks (`sharding`; DeepSeek's latent attention and grouped
experts: `latent_sharding`).

May import: pipeline.model.attention (the heads to split), pipeline.model.layers (the MLP), pipeline.step.
"""
