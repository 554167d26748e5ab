"""Hardware backends: the real node through NVML (``nvml``) and a simulated one (``sim``)."""
