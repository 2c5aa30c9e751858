"""KV-cache memory managers: paged blocks (vLLM), contiguous slots (static batching), a sliding
window, and prefix caching over the paged blocks."""
