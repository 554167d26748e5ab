"""``python -m gpuwarden.kubectl_plugin``: the plugin without its console script installed."""

import sys

from gpuwarden.kubectl_plugin.cli import main

sys.exit(main())
