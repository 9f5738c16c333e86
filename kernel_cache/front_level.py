"""The store's front level: one session's warm set (`kernel_cache.entries.warm_set` says why), loaded
at the program's first ask, served before every level, and saved at exit."""

from __future__ import annotations

import contextlib
import threading
import weakref

from kernel_cache import at_exit
from kernel_cache.entries import memo_entry, warm_set
from kernel_cache.entries.entry import Entry
from kernel_cache.store import Store


class WarmSet:
    """One session's warm set: what it loaded and what it read or wrote since. Thread-safe."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.level = "disk"  # where its members are served from, as the stats name a level
        self.active = store.disk is not None and not store.config.disabled and store.config.warm_sets
        self._lock = threading.Lock()
        self._first: str | None = None
        self._lineage: str | None = None  # the first ask's lineage, where the caller gave one
        self._loaded = 0  # members the loaded set listed
        self._held: dict[str, Entry] = {}  # its members the local level still holds
        self._signed: dict[str, str] = {}  # its signatures (signature -> member key)
        self._signing: dict[str, str] = {}  # signatures told by this session (`sign`)
        self._served: set[str] = set()  # served from the set, or otherwise used unread: told at save
        self._noted: dict[str, Entry] = {}  # read or written here, in order
        self._noted_bytes = 0
        if self.active:
            _open_sets.add(self)
            if "warm sets" not in at_exit.added:  # (a session adds it when it opens)
                at_exit.add("warm sets", save_all)

    def begin(self, first: str, lineage: str | None = None) -> None:
        """The program's first ask (a key or a signature) names its set: loaded here, once."""
        if self._first is not None:
            return
        with self._lock:
            if self._first is not None:
                return
            self._first, self._lineage = first, lineage
            if not self.active:
                return
            found = self._store.get_local(warm_set.set_key(first))
            if found is None:
                return
            try:
                members = warm_set.members_of(found)
            except ValueError:
                return  # another kind under this key, or a malformed set: written anew at exit
            held = self._store.held_locally(list(members))
            self._loaded = len(members)
            self._held = {key: data for key, data in members.items() if key in held}
            self._signed = {sig: key for sig, key in warm_set.signed_of(found).items() if key in held}

    def front_get(self, key: str) -> Entry | None:
        """A member of the loaded set, noted; None before the set is loaded (the program's first ask,
        not the store, names it)."""
        entry = self._held.get(key)
        if entry is not None and key not in self._noted:
            self._served.add(key)
            self.note(entry)
        return entry

    def signed(self, signature: str, lineage: str | None = None) -> Entry | None:
        """The member the set names for `signature` (the first call loads its set), noted; or None."""
        self.begin(signature, lineage)
        key = self._signed.get(signature)
        return None if key is None else self.front_get(key)

    def sign(self, signature: str, key: str) -> None:
        """`signature` names the entry `key` (read or written here): kept with the set if it is a member."""
        if self.active and self._signed.get(signature) != key and len(self._signing) < warm_set.MAX_MEMBERS:
            with self._lock:
                self._signing[signature] = key

    def touch_later(self, keys: list[str]) -> None:
        """Tell the levels' LRU order of a use of `keys` when the set is saved (at once where inactive)."""
        if not self.active:
            self._store.touch(keys)
            return
        with self._lock:
            self._served.update(keys)

    def predecessor(self) -> list[Entry]:
        """The members of the set the first ask's lineage last named, where this program found no set
        of its own; empty otherwise. Not noted, never served."""
        with self._lock:
            first, lineage, own = self._first, self._lineage, self._loaded
        if not self.active or first is None or lineage is None or own:
            return []
        found = self._store.get_local(memo_entry.memo_key(warm_set.LINEAGE, [lineage]))
        named = None if found is None else memo_entry.text_for(found, warm_set.LINEAGE, [lineage])
        if named is None or named == warm_set.set_key(first):
            return []
        previous = self._store.get_local(named)
        try:
            return list(warm_set.members_of(previous).values()) if previous is not None else []
        except ValueError:
            return []

    def note(self, entry: Entry) -> None:
        """`entry` was read or written by this session: a member of the set it writes at exit."""
        if not self.active or entry.key in self._noted:
            return
        size = sum(map(len, entry.blobs.values())) + 1024  # Entry.size, without a call into entry.py per member
        with self._lock:
            if self._first is None:
                self._first = entry.key
            if len(self._noted) < warm_set.MAX_MEMBERS and self._noted_bytes + size <= self._bound():
                self._noted[entry.key] = entry
                self._noted_bytes += size

    def _bound(self) -> int:
        """The members' bytes a set holds: warm_set.MAX_BYTES, within the store's entry bound (less its metadata)."""
        return min(warm_set.MAX_BYTES, self._store.config.max_entry_bytes - (1 << 20))

    def save(self) -> bool:
        """Write the set where it changed; whether it was written. Members served from the set are
        told to the levels' LRU order (their own reads were not)."""
        with self._lock:
            first, noted, held, served = self._first, dict(self._noted), dict(self._held), set(self._served)
            lineage = self._lineage
            signed, signing = dict(self._signed), dict(self._signing)
            self._served.clear()
        if served:
            self._store.touch(sorted(served))
        if not self.active or first is None or not noted:
            return False
        if all(key in held for key in noted) and len(held) == self._loaded and signing.items() <= signed.items():
            return False
        members: list[Entry] = []
        total, bound = 0, self._bound()
        for entry in [*noted.values(), *(e for k, e in held.items() if k not in noted)]:
            if len(members) >= warm_set.MAX_MEMBERS or total + entry.size + 1024 > bound:
                break
            members.append(entry)
            total += entry.size + 1024
        kept = warm_set.to_entry(first, members, {**signed, **signing})
        self._store.put_local(kept)
        if lineage is not None:  # the lineage names this set from now on (an upgraded process finds it)
            self._store.put_local(memo_entry.to_entry(warm_set.LINEAGE, [lineage], kept.key))
        with self._lock:  # what the set holds now: saving again writes nothing new
            self._loaded, self._held = len(members), {entry.key: entry for entry in members}
            self._signed = warm_set.signed_of(kept)
        return True


_open_sets: weakref.WeakSet[WarmSet] = weakref.WeakSet()


def save_all() -> None:
    """Save every open session's warm set (the exit sequence's first step)."""
    for warm in list(_open_sets):
        with contextlib.suppress(Exception):  # a cache never fails the program's exit
            warm.save()
