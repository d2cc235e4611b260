"""Typed application keys shared by the handlers."""

from __future__ import annotations

from aiohttp import web

from proxy.cache.memory import MemoryFront
from proxy.catalog import Catalog
from proxy.config import Settings
from proxy.gatekeeper import Gatekeeper
from proxy.inventory import InventoryReader
from proxy.metrics import Metrics
from proxy.mirror import Mirror
from proxy.module_mirror import ModuleMirror
from proxy.release_times import PublishDates
from proxy.rendered import RenderedDocuments
from proxy.storage import ArchiveGuard, ServedArchives
from proxy.warm_answers import WarmAnswers

SETTINGS = web.AppKey("settings", Settings)
MIRROR = web.AppKey("mirror", Mirror)
METRICS = web.AppKey("metrics", Metrics)
MODULES = web.AppKey("modules", ModuleMirror)
GUARD = web.AppKey("guard", ArchiveGuard)
RENDERED = web.AppKey("rendered", RenderedDocuments)
INVENTORY = web.AppKey("inventory", InventoryReader)
SERVED = web.AppKey("served", ServedArchives)
CATALOG = web.AppKey("catalog", Catalog)
MEMORY_FRONT = web.AppKey("memory_front", MemoryFront)
GATEKEEPER = web.AppKey("gatekeeper", Gatekeeper)
PUBLISH_DATES = web.AppKey("publish_dates", PublishDates)
WARM_ANSWERS = web.AppKey("warm_answers", WarmAnswers)
