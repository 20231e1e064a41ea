"""``python -m broker``: the same as the ``sluice`` command."""

import sys

from broker.cli.main import main

sys.exit(main())
