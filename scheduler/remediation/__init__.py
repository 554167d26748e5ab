"""Remediation: sick hardware out, work off it, repaired, re-validated, back.

The pure core lives here and imports no Kubernetes client: ``model`` (the
record persisted on the Node and what the controller observes), ``policy``
(drain policies and the machine's settings), ``breaker`` (how much of a pool
may be out), ``steps`` (what the controller is asked to do) and ``machine``
(the transition function that ties them together). The controller that reads
the cluster and carries the steps out is built on these.
"""
