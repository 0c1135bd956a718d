"""``python -m gfd_bench``: see :mod:`gfd_bench.pool`."""

import sys

from .pool import main

sys.exit(main())
