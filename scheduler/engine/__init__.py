"""The scheduling engine: pure Python over plain data, no Kubernetes imports.

``run_session(snapshot)`` is the whole interface (see ``session``); the
Kubernetes side builds the Snapshot and executes the Decisions.
"""
