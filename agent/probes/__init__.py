"""Probes: what the agent does with its sources beyond reading them.

The GPU probe retries a GPU library that will not open and runs its event
thread; the kmsg probe parses kernel-log records, dates them and keeps a
cursor across restarts. The readers themselves live in :mod:`agent.sources`.
"""
