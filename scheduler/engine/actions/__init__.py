"""The session's actions, one per module, each a ``run(cluster, caches)`` over one session."""
