"""`python -m kernel_cache` runs cachectl."""

import sys

from cachectl import main

sys.exit(main())
