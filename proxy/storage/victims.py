"""Which stored archives go: least-recently-served eviction under a size cap, and gc's orphans. Pure.

An archive's last use is the later of when it was last served (fleet-wide, from the metadata store)
and when its file was stored, so a fresh archive that nobody fetched yet counts as just used. Two
rules protect what may be in use anywhere: an archive pinned in this process (a response is
streaming it) is never chosen, and neither is one used within the grace window, which covers the
responses of other processes and replicas (their served times reach the metadata store at least
once a minute) and an archive published a moment ago whose record is still being written. A
served time further in the future than the grace (a skewed clock, or a forged entry) is ignored,
so it cannot shield an archive forever.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from typing import Protocol, TypeVar


class StoredObject(Protocol):
    """What the store lists about an object (`proxy.storage.objects.ObjectInfo`)."""

    @property
    def sha256(self) -> str: ...

    @property
    def size(self) -> int: ...

    @property
    def modified(self) -> float: ...


Obj = TypeVar("Obj", bound=StoredObject)


def last_use(obj: StoredObject, served: Mapping[str, float], now: float, grace: float) -> float:
    """When `obj` was last served or stored, whichever is later (epoch seconds)."""
    seen = served.get(obj.sha256, -math.inf)
    if seen > now + grace:
        seen = -math.inf
    return max(seen, obj.modified)


def in_use(obj: StoredObject, served: Mapping[str, float], pinned: Collection[str], now: float, grace: float) -> bool:
    """Pinned here, or served or stored within the last `grace` seconds."""
    return obj.sha256 in pinned or now - last_use(obj, served, now, grace) < grace


def excess_bytes(total: int, cap: int | None, free: int | None = None, min_free: int = 0) -> int:
    """Bytes to free: what the store holds beyond `cap`, or what the disk lacks below its free-space
    floor (when `free` is known), whichever is more; 0 when neither applies."""
    over_cap = total - cap if cap is not None else 0
    below_floor = min_free - free if free is not None else 0
    return max(over_cap, below_floor, 0)


def victims(
    objects: Iterable[Obj],
    served: Mapping[str, float],
    *,
    excess: int,
    now: float,
    grace: float,
    pinned: Collection[str] = (),
) -> list[Obj]:
    """The least recently used objects, oldest first, until at least `excess` bytes are freed (fewer if
    the objects not in use do not hold that much); ties go by SHA-256 so the choice is stable."""
    if excess <= 0:
        return []
    candidates = sorted(
        (obj for obj in objects if not in_use(obj, served, pinned, now, grace)),
        key=lambda obj: (last_use(obj, served, now, grace), obj.sha256),
    )
    chosen: list[Obj] = []
    freed = 0
    for obj in candidates:
        if freed >= excess:
            break
        chosen.append(obj)
        freed += obj.size
    return chosen


def orphans(
    objects: Iterable[Obj],
    referenced: Collection[str],
    served: Mapping[str, float],
    *,
    now: float,
    grace: float,
    pinned: Collection[str] = (),
) -> list[Obj]:
    """Objects no metadata record refers to and not in use (gc), in SHA-256 order."""
    return sorted(
        (obj for obj in objects if obj.sha256 not in referenced and not in_use(obj, served, pinned, now, grace)),
        key=lambda obj: obj.sha256,
    )
