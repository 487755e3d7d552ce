"""Debian's Chromium, headless, driven by Selenium through Debian's chromedriver.

Both paths are given explicitly so Selenium Manager never tries to download a browser or a
driver (the network is closed to them). CI installs the two packages (.ci/run); elsewhere the
browser tests skip with the reason, unless ``AGENTOPS_REQUIRE_BROWSER=1`` makes that a failure.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = os.environ.get("AGENTOPS_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("AGENTOPS_CHROMEDRIVER", "/usr/bin/chromedriver")
ARGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def browser_required() -> bool:
    return os.environ.get("AGENTOPS_REQUIRE_BROWSER") == "1"


def chromium_problem() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (os.path.exists(path) or shutil.which(path)):
            return (
                f"{path} is missing: apt-get install -y chromium chromium-driver "
                f"(Debian package {package})"
            )
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is missing: pip install -e '.[dev]'"
    return None


def chromium_start(*, width: int = 1400, height: int = 1000) -> WebDriver:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    # Selenium Manager stays offline and quiet even if something asks it to look.
    os.environ.setdefault("SE_OFFLINE", "true")
    os.environ.setdefault("SE_AVOID_STATS", "true")
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ARGS:
        options.add_argument(arg)
    options.add_argument(f"--window-size={width},{height}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    return driver
