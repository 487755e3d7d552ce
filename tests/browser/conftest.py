"""The ``browser`` fixture: a headless Chromium per test (tests.browser.driver)."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING

import pytest

from tests.conftest import LOG_DIR

from .driver import browser_required, chromium_problem, chromium_start

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def browser(request: pytest.FixtureRequest) -> Iterator[WebDriver]:
    problem = chromium_problem()
    if problem is not None:
        if browser_required():
            pytest.fail(f"AGENTOPS_REQUIRE_BROWSER=1 but the browser cannot run: {problem}")
        pytest.skip(f"no headless Chromium here: {problem}")
    driver = chromium_start()
    yield driver
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        # What the browser saw when the test failed, for whoever reads the CI log.
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(LOG_DIR / f"browser-{request.node.name}.png"))
        (LOG_DIR / f"browser-{request.node.name}.html").write_text(driver.page_source)
    driver.quit()
