"""gpuwarden agent: per-node GPU and InfiniBand health, published to Kubernetes."""

__version__ = "0.1.0"
