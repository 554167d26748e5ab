"""The real node's sources, one reader per hardware source, behind the interfaces in :mod:`agent.sources.base`.

NVML (``nvml``), the kernel log (``kmsg``), InfiniBand ports in sysfs
(``infiniband``) with their netdevs through netlink (``netdev``), shared
storage (``storage``), and which pod holds which device as the kubelet's
PodResources API says (``podresources``). The sim (:mod:`agent.sim`)
implements the same interfaces; :mod:`agent.hardware` picks one or the other.
"""
