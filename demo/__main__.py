"""``python -m demo ...`` is ``gpuwarden demo ...``, for a checkout whose install predates the entry point."""

from __future__ import annotations

import sys

from demo.cli import register
from gpuwarden.cli import main

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]], commands=[("demo", register)]))
