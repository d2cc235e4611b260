"""Typed application keys shared by the handlers."""

from __future__ import annotations

from aiohttp import web

from proxy.config import Settings
from proxy.inventory import InventoryReader
from proxy.metrics import Metrics
from proxy.mirror import Mirror
from proxy.module_mirror import ModuleMirror
from proxy.rendered import RenderedDocuments
from proxy.storage import ArchiveGuard, ServedArchives

SETTINGS = web.AppKey("settings", Settings)
MIRROR = web.AppKey("mirror", Mirror)
METRICS = web.AppKey("metrics", Metrics)
MODULES = web.AppKey("modules", ModuleMirror)
GUARD = web.AppKey("guard", ArchiveGuard)
RENDERED = web.AppKey("rendered", RenderedDocuments)
INVENTORY = web.AppKey("inventory", InventoryReader)
SERVED = web.AppKey("served", ServedArchives)
