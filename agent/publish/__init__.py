"""Publishers: turn the agent's HealthReport into what people and the scheduler see.

One publisher per module (NodeConditions, capacity, GPUNode, Events, metrics),
plus :mod:`gpuwarden.kube` for the API access they share and
:mod:`gpuwarden.http` (shared with the scheduler) for the /metrics, /healthz and /readyz endpoint.
"""
