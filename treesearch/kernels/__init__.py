"""Compiled CPU kernels over plain tensors (attention over cached runs, the compile-and-cache helper,
SIMD macros): below the cache and the models, so that every layer above computes with them."""
