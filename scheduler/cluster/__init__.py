"""The scheduler's Kubernetes side: watch cache, conversion, executors; the engine never imports it."""
