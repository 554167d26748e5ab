"""The kubelet's PodResources API (gRPC on the node): which pod holds which device.

On a device-plugin node the kubelet's device manager chooses the devices a
container gets, so nobody but the kubelet knows which pod sits on which GPU.
It says so over a unix socket (``/var/lib/kubelet/pod-resources/kubelet.sock``)
with the ``v1.PodResourcesLister`` service. The generated client and servicer
live in :mod:`gpuwarden.podresources.v1`; :mod:`gpuwarden.podresources.fake` is
a real gRPC server of that service, for tests and the stand-in kubelet. The
agent's reader is :mod:`agent.sources.podresources`.

Kept in the shared core, not in the agent: the stand-in kubelet
(:mod:`gpuwarden.localcluster`) serves the same service.
"""
