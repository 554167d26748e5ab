"""``kubectl gpuwarden``: what the agent and the scheduler wrote, read back for a person.

The agent and the scheduler each write part of the story into the API:
NodeConditions and a GPUNode per node, remediation's labels on the Node,
fair share and allocation on each Queue, an explanation and reservations on
each PodGroup, Events. ``kubectl get`` shows one object at a time; the
questions an operator asks ("which nodes are sick and what is being done",
"who holds the GPUs", "why does my job wait") need several joined. The plugin
does that join and nothing else: it only reads.

Why it lives in the core, not under ``scheduler/``: ``nodes``, ``queues``
and ``why`` read plain JSON through :mod:`gpuwarden.kube` and interpret it by
the names in :mod:`gpuwarden.contract` and the CRD schemas, so they need
neither process. ``simulate FILE`` needs the engine; it reaches it the way
the ``gpuwarden`` command reaches any subcommand, through the
``gpuwarden.commands`` entry points (``gpuwarden scheduler --snapshot FILE``),
so the core still imports neither ``agent`` nor ``scheduler``
(``tests/test_layout.py``), and an install without the scheduler gets a
plugin whose ``simulate`` says so instead of failing on an import.

Modules: :mod:`.views` (pure: API objects in, the rows people read out),
:mod:`.render` (tables, JSON, YAML), :mod:`.cli` (flags, the connection,
errors a person can act on).
"""
