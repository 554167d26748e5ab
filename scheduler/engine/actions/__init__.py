"""The session's actions, one per module, each a ``run(cluster)`` over one session."""
