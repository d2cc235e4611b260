"""`registry-proxy rotate-secret`: the last step of a rotation of the metadata secret.

Run with the new secret as `--metadata-secret` and the old one as `--metadata-secret-accepted`, once every
replica reads with both and writes with the new one (docs/operations.md, "Rotating the metadata secret"):
every record still sealed with the old secret is sealed again with the new one, in place (its expiry kept,
and only if nobody rewrote it meanwhile), then the fleet's marker. After it, the replicas may drop the old
secret: nothing in the store needs it. What no secret opens is left as it is (a replica refuses it anyway).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.metadata_store.fleet_secret import FleetSecret, MarkerStore
from proxy.metadata_store.sealed import Seal


@dataclass
class RotationReport:
    resealed: int = 0  # sealed again with the new secret
    current: int = 0  # already sealed with it
    rewritten: int = 0  # written again by a replica while this ran (with the new secret: nothing to do)
    unreadable: list[str] = field(default_factory=list)  # opened by no secret given: left as they are
    marker: bool = False  # the fleet's marker is sealed with the new secret


async def rotate_secret(store: MarkerStore, seal: Seal, fleet: FleetSecret) -> RotationReport:
    """Seal every record of `store` that an accepted secret opens with `seal`'s own secret, then the marker."""
    report = RotationReport()
    async for key in store.sealed_keys():
        stored = await store.get_kept(key)
        if stored is None:  # expired or removed meanwhile
            continue
        value, own, _ = seal.unseal(key, stored)
        if value is None:
            report.unreadable.append(key)
        elif own:
            report.current += 1
        elif await store.swap(key, stored, seal.close(key, value)):
            report.resealed += 1
        else:
            report.rewritten += 1
    report.marker = await fleet.reseal()  # last: a rotation stopped halfway is run again
    return report


def report_lines(report: RotationReport) -> list[str]:
    lines = [
        f"rotate-secret: {report.resealed} records sealed again with the new secret, {report.current} already were, "
        f"{report.rewritten} rewritten meanwhile by a replica, {len(report.unreadable)} opened by neither secret "
        "(left as they are)"
    ]
    lines += [f"  unreadable: {key}" for key in report.unreadable[:20]]
    if report.marker:
        lines.append(
            "the fleet's marker sealed with the new secret: restart the replicas without --metadata-secret-accepted"
        )
    else:
        lines.append("the fleet's marker could not be sealed again (the store did not answer): run this again")
    return lines
