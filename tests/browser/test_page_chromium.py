"""The page at `/` in real headless Chromium against a real proxy process.

Chromium trusts the proxy's generated certificate by its public key (`--ignore-certificate-errors-spki-list`,
nothing else is waived), so the page is a secure context as it is for a user who trusted the CA. The
test takes full-page screenshots at 1280 and 390 CSS pixels (in the test's tmp dir; also copied to
`$PAGE_SCREENSHOT_DIR` when set), checks that a copy button puts the exact snippet on the system
clipboard, that the search filters with and without the script, that the Content-Security-Policy
blocks nothing of the page's own, and that the inventory lists what a fetch just cached.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import shutil
import ssl
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from proxy.web.home_page import mirror_config
from tests.browser.conftest import CHROMEDRIVER, CHROMIUM
from tests.conftest import PROVIDER, REGISTRY_HOST
from tests.fakes.packages import MODULE_FILES, module_tar_gz
from tests.fakes.registry import ModuleRelease

pytestmark = pytest.mark.browser

ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
MODULE = f"/registry/{REGISTRY_HOST}/modules/v1/acme/net/aws/1.0.0"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--hide-scrollbars",
)
WAIT = 15  # seconds at most for the browser to show a change (polled, not slept)


def spki_pin(server_pem: Path) -> str:
    """The base64 SHA-256 of the server certificate's public key, as Chromium's SPKI list takes it."""
    certificate = x509.load_pem_x509_certificate(server_pem.read_bytes())
    der = certificate.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


class Chromium:
    """One headless Chromium with a fresh profile (selenium's calls block: run them in a thread)."""

    def __init__(self, profile: Path, pin: str) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in (*FLAGS, f"--user-data-dir={profile}", f"--ignore-certificate-errors-spki-list={pin}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))

    def wait(self, condition, what: str):
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, WAIT, poll_frequency=0.05).until(lambda _: condition(), what)

    def css(self, selector: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def visible_rows(self, table: str) -> list[str]:
        return [" ".join(row.text.split()) for row in self.css(f"#{table} tbody tr") if row.is_displayed()]

    def screenshot(self, width: int, path: Path) -> int:
        """A full-page PNG at `width` CSS pixels; the page's scroll width at that size."""
        self.driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": width < 600},
        )
        self.driver.refresh()
        self.wait(lambda: self.driver.execute_script("return document.readyState") == "complete", "page load")
        size = self.driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
        shot = self.driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": size["height"], "scale": 1},
            },
        )
        path.write_bytes(base64.b64decode(shot["data"]))
        return self.driver.execute_script("return document.documentElement.scrollWidth")

    def console_errors(self) -> list[str]:
        return [entry["message"] for entry in self.driver.get_log("browser") if entry["level"] == "SEVERE"]

    def quit(self) -> None:
        self.driver.quit()


async def fetch(session: aiohttp.ClientSession, url: str, context: ssl.SSLContext) -> aiohttp.ClientResponse:
    async with session.get(url, ssl=context) as response:
        await response.read()
        assert response.status == 200, url
        return response


async def test_the_page_in_chromium(proxy_process, registry, tmp_path):
    registry.static["net-1.0.0.tar.gz"] = module_tar_gz(MODULE_FILES)
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.0.0", "{base}/static/net-1.0.0.tar.gz"))
    process = await proxy_process()
    context = ssl.create_default_context(cafile=str(process.ca_file))
    async with aiohttp.ClientSession() as session:  # what a client's init fetches: a provider and a module
        await fetch(session, process.url + ARCHIVE, context)
        download = await fetch(session, f"{process.url}{MODULE}/download", context)
        await fetch(session, process.url + download.headers["X-Terraform-Get"], context)
    browser = await asyncio.to_thread(Chromium, tmp_path / "profile", spki_pin(process.data_dir / "tls" / "server.pem"))
    try:
        shots = await asyncio.to_thread(drive, browser, process.url, tmp_path)
    finally:
        await asyncio.to_thread(browser.quit)
    await asyncio.to_thread(keep, shots)


def keep(shots: list[Path]) -> None:
    """Copy the screenshots to `$PAGE_SCREENSHOT_DIR`, when set, to look at them after the run."""
    if target := os.environ.get("PAGE_SCREENSHOT_DIR"):
        Path(target).mkdir(parents=True, exist_ok=True)
        for shot in shots:
            shutil.copy(shot, Path(target) / shot.name)


def drive(browser: Chromium, url: str, tmp_path: Path) -> list[Path]:
    from selenium.webdriver.common.keys import Keys

    driver = browser.driver
    driver.get(url + "/")
    assert driver.title.startswith("registry-proxy")
    # The inventory lists what the fetches just cached.
    [provider] = browser.visible_rows("providers")
    assert provider.startswith(f"{PROVIDER} 1.0.0 linux_amd64")
    [module] = browser.visible_rows("modules")
    assert module.startswith(f"{REGISTRY_HOST}/acme/net/aws 1.0.0")
    # The style sheet and the script ran under the policy (nothing blocked, nothing else failed).
    assert driver.execute_script("return getComputedStyle(document.body).backgroundColor") == "rgb(246, 247, 249)"
    assert browser.console_errors() == []
    # The copy button (shown by the script) puts the exact snippet on the system clipboard.
    driver.execute_cdp_cmd(
        "Browser.grantPermissions", {"origin": url, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]}
    )
    button = browser.css('button.copy[data-target="mirror-opentofu"]')[0]
    assert button.is_displayed() and button.text == "Copy"
    button.click()
    browser.wait(lambda: button.get_attribute("data-copied") == "yes", "the copy button to report success")
    clipboard = driver.execute_async_script(
        "navigator.clipboard.readText().then(arguments[0], e => arguments[0]('clipboard error: ' + e))"
    )
    assert clipboard.endswith(mirror_config(url + "/")) and clipboard.startswith("# ~/.tofurc\n")
    # The script filters as one types; the form searches on the server (also without the script).
    search = browser.css("#q")[0]
    search.send_keys("acme/net")
    browser.wait(lambda: browser.visible_rows("providers") == [], "the filter to hide the provider")
    assert len(browser.visible_rows("modules")) == 1
    search.send_keys(Keys.ENTER)
    browser.wait(lambda: "q=acme%2Fnet" in driver.current_url, "the search to be submitted")
    assert browser.css("#providers") == [] and len(browser.visible_rows("modules")) == 1
    driver.get(url + "/")
    shots = []
    for width in (1280, 390):
        shot = tmp_path / f"page-{width}.png"
        assert browser.screenshot(width, shot) <= width, f"the page is wider than {width} px"
        assert shot.stat().st_size > 10_000
        shots.append(shot)
    assert browser.console_errors() == []
    return shots
