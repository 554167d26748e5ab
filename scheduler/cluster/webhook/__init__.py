"""The scheduler's mutating admission webhook for GPU-sharing pods (``gpuwarden webhook``).

A slice pod must obey its slice on the node, and a malformed request is
better refused at ``kubectl apply`` than explained later by a pending pod.
So on pod creation the webhook checks the GPU-sharing annotations with the
engine's own parser (:mod:`.review`), and for a slice pod injects the
``envFrom`` of the ConfigMap the scheduler writes before binding it
(:mod:`scheduler.cluster.sliceconfig`) and the runtime class that runs
HAMi-core. It is served over HTTPS (:mod:`.server`) with a certificate from
files (cert-manager) or one it bootstraps itself and trusts through the
webhook configuration's ``caBundle`` (:mod:`.certs`); it knows the largest GPU
in the cluster from a watch of Nodes and GPUNodes (:mod:`.inventory`).

It runs as its own process (a second container in each scheduler pod, so it
answers on both replicas, leader or not): a scheduling cycle over 150,000
pods holds the interpreter for seconds, and admission must not wait for it.
"""
