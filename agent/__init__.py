"""gpuwarden agent: per-node GPU and InfiniBand health, published to Kubernetes."""
