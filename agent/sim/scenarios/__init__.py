"""Sim scenario files shipped with gpuwarden (``--scenario NAME``)."""
