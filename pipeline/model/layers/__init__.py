"""The building blocks the model families share: RMSNorm in three forms (`norms`), rotary embedding in
two layouts (`rope`), the gated MLP (`mlp`), routed experts (`moe`), weight-only quantized linear layers
(`quantized_linear`) and the swap of a loaded model's linears for them (`quantize`).

May import: pipeline.model.cpu (the native kernels), pipeline.loading (GGUF's kept 4-bit blocks).
"""
