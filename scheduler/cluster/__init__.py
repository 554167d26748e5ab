"""The scheduler's Kubernetes edge: watched objects in, API calls out.

Everything here turns Kubernetes objects into the engine's plain data (and
the engine's decisions back into API calls); the engine never sees a
Kubernetes object.
"""
