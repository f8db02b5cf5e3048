"""``python -m aioelastic`` is the ``aioelastic`` command."""

import sys

from .cli import main

sys.exit(main())
