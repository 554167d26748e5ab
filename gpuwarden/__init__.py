"""gpuwarden's shared core: the contract, the Kubernetes API wrapper, logging, flags, the CLI.

The agent and the scheduler both import this package and never each other, so
either can change, be tested or be deployed without dragging the other along.
"""

__version__ = "0.1.0"
