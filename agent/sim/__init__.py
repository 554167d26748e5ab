"""The simulated node: a scripted GPU node with faults injected on demand.

A scenario file (:mod:`agent.sim.scenario`) describes the node (GPU model,
count, memory, NVLinks, PCIe, HCAs, shared mounts) and a timeline of faults
at given seconds after start. A :class:`~agent.sim.node.SimNode` holds the
node's state (:mod:`agent.sim.state`), applies faults to it through one table
(:mod:`agent.sim.faults`), and answers through the same interfaces as the real
node (:mod:`agent.sim.sources`, behind :mod:`agent.sources.base`): GPU samples
and NVML-style events, kernel-log records in the real ``/dev/kmsg`` format (so
the kmsg parser and the NVML/kmsg de-duplication run exactly as on hardware),
InfiniBand port samples and mount checks. Nothing is read from the host: the
sim node is the whole node.

Every ``SimNode`` keeps all of its state itself, so one process can run many
of them side by side, each with its own agent.

Example, from a test or benchmark thread while the agent runs::

    node = SimNode(load_scenario("default"))
    monitor = Monitor(config, node.hardware(), "node-a")
    ...
    node.inject("xid", gpu=2, xid=79)
"""
