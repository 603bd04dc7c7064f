"""The building blocks the model families share: RMSNorm (`norms`), rotary embedding (`rope`), the gated
MLP (`mlp`), routed experts (`moe`), weight-only quantized linear layers (`quantized_linear`) and the
swap of a loaded model's linears for them (`quantize`).

May import: pipeline.model.cpu (the native kernels), pipeline.loading (GGUF's kept 4-bit blocks).
"""
