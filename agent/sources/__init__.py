"""The real node's sources, one reader per hardware source, behind the interfaces in :mod:`agent.sources.base`.

NVML (``nvml``), the kernel log (``kmsg``), InfiniBand ports in sysfs
(``infiniband``) with their netdevs through netlink (``netdev``), and shared
storage (``storage``), and the kubelet's PodResources API (``podresources``). The sim (:mod:`agent.sim`) implements the same
interfaces; :mod:`agent.hardware` picks one or the other.
"""
