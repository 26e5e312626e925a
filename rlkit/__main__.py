"""``python -m rlkit``: the same command line as ``rlkit``."""

import sys

from rlkit.cli import main

sys.exit(main())
