"""The model layer: the one place that touches tensors on the device. Loading (models, convert/), the
runner's forwards (runner, tree_mask, attention, fast_linear and the native kernels), the KV caches
(kv_cache, batch_cache, prefix_cache, kv_memory) and token choice (sampling)."""
