"""The native CPU kernels: C sources in csrc/ built on first use with the system compiler (`library`),
their Python bindings (`kernels`), and the linear layers that run on them or on oneDNN (`linear`).

May import: pipeline.loading (the cache directory the built library lives in).
"""
