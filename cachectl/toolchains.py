"""Which toolchain is installed for a target: what `--stale` compares entries against (imports Triton)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compiler.target import Target
from compiler.toolchain import toolchain_summary


def installed_summary(target: dict[str, Any], memo_dir: Path | None) -> str | None:
    """The installed toolchain's summary, or None when that backend is not installed here."""
    try:
        return toolchain_summary(Target.from_json(target), memo_dir)
    except Exception:
        return None
