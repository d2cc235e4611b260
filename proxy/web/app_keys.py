"""Typed application keys shared by the handlers."""

from __future__ import annotations

from aiohttp import web

from proxy.governance.catalog import Catalog
from proxy.governance.gatekeeper import Gatekeeper
from proxy.governance.inventory import InventoryReader
from proxy.governance.release_times import PublishDates
from proxy.governance.signing_keys import SigningKeys
from proxy.metadata_store.fleet_secret import FleetSecret
from proxy.metadata_store.memory import MemoryFront
from proxy.modules.mirror import ModuleMirror
from proxy.providers.mirror import Mirror
from proxy.runtime.metrics import Metrics
from proxy.settings.config import Settings
from proxy.storage import ArchiveGuard, ArchiveUsage
from proxy.web.renderings import Renderings
from proxy.web.warm_answers import WarmAnswers

SETTINGS = web.AppKey("settings", Settings)
MIRROR = web.AppKey("mirror", Mirror)
METRICS = web.AppKey("metrics", Metrics)
MODULES = web.AppKey("modules", ModuleMirror)
GUARD = web.AppKey("guard", ArchiveGuard)
RENDERINGS = web.AppKey("renderings", Renderings)
INVENTORY = web.AppKey("inventory", InventoryReader)
ARCHIVE_USAGE = web.AppKey("archive_usage", ArchiveUsage)
CATALOG = web.AppKey("catalog", Catalog)
MEMORY_FRONT = web.AppKey("memory_front", MemoryFront)
GATEKEEPER = web.AppKey("gatekeeper", Gatekeeper)
PUBLISH_DATES = web.AppKey("publish_dates", PublishDates)
WARM_ANSWERS = web.AppKey("warm_answers", WarmAnswers)
FLEET_SECRET = web.AppKey("fleet_secret", FleetSecret)  # the metadata store's marker of the fleet's secret
SIGNING_KEYS = web.AppKey("signing_keys", SigningKeys)
