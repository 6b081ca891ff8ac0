"""The page in a real browser: Debian's headless Chromium driven through chromedriver by
selenium (the ``browser`` extra), nothing downloaded. For the page's test and docs/serving.md's
screenshot (``python tools/serve_screenshot.py``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

# What a root process on a machine without a network needs: no sandbox, no GPU, no calls home
# (Chromium's background connections are refused here, many at a time).
FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1100,1000",
)  # fmt: skip


def executables() -> tuple[str, str] | None:
    """(chromium, chromedriver) where both are installed, else None."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    return None if chromium is None or driver is None else (chromium, driver)


def chromium() -> Any:
    """A headless Chromium under selenium's control; quit it when done."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = executables()
    if found is None:
        raise FileNotFoundError("chromium and chromedriver are not installed: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for flag in FLAGS:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=found[1]), options=options)


def run_page(driver: Any, url: str, text: str, timeout: float = 120.0) -> str:
    """Open the page at ``url``, type ``text``, press Run and wait for the heat map; returns the
    output shown (the translation or continuation)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url.rstrip("/") + "/")
    wait = WebDriverWait(driver, timeout)
    wait.until(lambda d: "(" in d.find_element(By.ID, "model").text)  # /health answered: "name (family)"
    box = driver.find_element(By.ID, "input")
    box.clear()
    box.send_keys(text)
    driver.find_element(By.ID, "run").click()
    wait.until(lambda d: int(d.find_element(By.ID, "heatmap").get_attribute("data-rows")) > 0)
    return driver.find_element(By.ID, "output").text


def screenshot(url: str, text: str, path: Path, kind: str = "cross", layer: int = -1, head: int = 0) -> str:
    """The page after ``text``, its heat map showing ``kind`` at ``layer`` (negative: from the
    last) and ``head``, as a PNG."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = chromium()
    try:
        output = run_page(driver, url, text)
        if layer < 0:
            layer += len(Select(driver.find_element(By.ID, "layer")).options)
        for select, value in (("kind", kind), ("layer", str(layer)), ("head", str(head))):
            Select(driver.find_element(By.ID, select)).select_by_value(value)
        path.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(path))
        return output
    finally:
        driver.quit()
