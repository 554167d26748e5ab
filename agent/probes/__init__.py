"""Probes: read the node (GPUs, kernel log, InfiniBand, netdevs, storage) into raw samples, one probe per module."""
