"""How `cachectl show` presents a compiled kernel (and an entry of a kind this version does not
know, which has no view of its own): launch parameters, toolchain, blobs and the recipe prewarm
rebuilds it from."""

from __future__ import annotations

import json

from cachectl.inventory import EntryInfo
from cachectl.render import human_size, human_time
from cachectl.show_views import ShowArgs
from kernel_cache.entries.entry import Entry
from kernel_cache.entries.summary import EntrySummary


def show(entry: Entry, info: EntryInfo, args: ShowArgs) -> None:
    """`cachectl show KEY` of a kernel; with -v its whole metadata too."""
    meta, summary = entry.meta, EntrySummary.from_meta(entry.meta)
    blobs = {name: len(data) for name, data in sorted(entry.blobs.items())}
    print(f"key          {entry.key}  ({info.level})")
    print(f"kernel       {summary.kernel}")
    print(f"arch         {summary.arch}  warps={meta.get('num_warps')} stages={meta.get('num_stages')}"
          f" ctas={meta.get('num_ctas')} shared_mem={meta.get('shared_mem')}")
    print(f"toolchain    {summary.toolchain or '?'}")
    print(f"compiled     {human_time(summary.created)} in {summary.compile_seconds:.3f} s")
    print(f"last used    {human_time(info.last_used)}   hits {args.hits}")
    print(f"size         {human_size(info.size_bytes)}  blobs: "
          + ", ".join(f"{n} {human_size(s)}" for n, s in blobs.items()))
    recipe = summary.recipe
    if not recipe:
        print("recipe       none (the entry records no recipe; prewarm cannot rebuild it)")
    for n, (field, value) in enumerate(sorted((recipe or {}).items())):
        shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        print(f"{'recipe' if n == 0 else '':<13}{field:<11} {shown}")
    if args.verbose:
        print("metadata     " + json.dumps(meta, indent=2, sort_keys=True).replace("\n", "\n             "))
