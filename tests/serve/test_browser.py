"""The page in a real browser: headless Chromium (Debian's chromium and chromium-driver,
driven by selenium; nothing downloaded) loads the page from a live ``attnkit serve``, a
sentence is typed, the streamed translation arrives, and the cross-attention heat map is
drawn with one row per target token and one column per source token. The screenshot is kept
in ``build/test-artifacts/``."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from attnkit.models import Model

webdriver = pytest.importorskip(
    "selenium.webdriver", reason="the browser extra is not installed: pip install 'attnkit[browser]'"
)
httpx = pytest.importorskip("httpx")
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="needs Debian's chromium and chromium-driver (make setup installs them with apt-get where it can)",
)
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
SENTENCE = "And God said, let there be light."


def browser() -> webdriver.Chrome:
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM  # type: ignore[assignment]
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1100,1000"):  # fmt: skip
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)


def test_the_page_streams_a_translation_and_draws_its_attention(
    translator: Model, tmp_path: Path, serving: Callable
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    translator.save_pretrained(tmp_path / "translator")
    with serving(tmp_path / "translator") as (url, _, _):
        driver = browser()
        try:
            driver.get(url + "/")
            wait = WebDriverWait(driver, 60)
            wait.until(lambda d: "(transformer)" in d.find_element(By.ID, "model").text)
            box = driver.find_element(By.ID, "input")
            box.clear()
            box.send_keys(SENTENCE)
            driver.find_element(By.ID, "run").click()
            wait.until(lambda d: int(d.find_element(By.ID, "heatmap").get_attribute("data-rows")) > 0)
            output = driver.find_element(By.ID, "output").text
            assert output and "tokens/s" in driver.find_element(By.ID, "status").text
            Select(driver.find_element(By.ID, "kind")).select_by_value("cross")
            reference = httpx.post(f"{url}/v1/attention", json={"text": SENTENCE, "target": output}).json()
            canvas = driver.find_element(By.ID, "heatmap")
            rows, cols = int(canvas.get_attribute("data-rows")), int(canvas.get_attribute("data-cols"))
            assert (rows, cols) == (len(reference["tokens"]["target"]), len(reference["tokens"]["source"]))
            inked = driver.execute_script(
                "const c = document.getElementById('heatmap'), d = c.getContext('2d')"
                ".getImageData(110, 110, c.width - 120, c.height - 120).data;"
                "let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i] < 250) n++; return n;"
            )
            assert inked > rows * cols  # the cells are painted, not left white
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(ARTIFACTS / "serve-page.png"))
        finally:
            driver.quit()
