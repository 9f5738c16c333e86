"""`python -m kernel_cache` runs cachectl."""

import sys

from .cli import main

sys.exit(main())
