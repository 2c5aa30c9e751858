"""What a deployment is made of, as published numbers: model architectures (config.json),
GPUs (datasheets) and the GPU-memory budget that follows from them."""
