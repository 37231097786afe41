"""``python -m trioserve.cli``: the same as ``trioserve``."""

import sys

from trioserve.cli import main

sys.exit(main())
