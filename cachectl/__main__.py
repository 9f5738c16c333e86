"""`python -m cachectl` runs cachectl (as the `cachectl` command and `python -m kernel_cache` do)."""

import sys

from cachectl.main import main

sys.exit(main())
