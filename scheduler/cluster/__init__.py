"""The Kubernetes side of the scheduler: watch cache, conversion, executors.

Everything that knows Kubernetes objects lives here: turning watched Nodes,
GPUNodes, Pods, Queues and PodGroups into the engine's Snapshot, and turning
its Decisions into API calls. The engine (``scheduler.engine``) never imports
this package, so it stays pure data in, data out.
"""
