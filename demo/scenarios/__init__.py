"""The demo scenarios shipped with gpuwarden (package data, read by :mod:`demo.scenario`)."""
