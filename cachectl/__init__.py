"""cachectl, the operator's floor: see, bound, check, warm and move a kernel-cache directory.

`main` parses and dispatches to a command in the room of its job (`see/`, `bound/`, `check/`,
`warm/`, `move/`); what several rooms share sits here: a run's state (`context`), rendering
(`render`), the entries and what is done to them (`inventory`, `entry_kinds`).
"""

from cachectl.main import main

__all__ = ["main"]
