"""The page in a real browser: headless Chromium (Debian's chromium and chromium-driver,
driven by selenium; nothing downloaded) loads the page from a live ``attnkit serve``, a
sentence is typed, the streamed translation arrives, and the cross-attention heat map is
drawn with one row per target token and one column per source token. The screenshot is kept
in ``build/test-artifacts/``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from attnkit.models import Model

pytest.importorskip("selenium", reason="the browser extra is not installed: pip install 'attnkit[browser]'")
httpx = pytest.importorskip("httpx")
from attnkit.serve.browser import chromium, executables, run_page  # noqa: E402

pytestmark = pytest.mark.skipif(
    executables() is None,
    reason="needs Debian's chromium and chromium-driver (make setup installs them with apt-get where it can)",
)
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
SENTENCE = "And God said, let there be light."


def test_the_page_streams_a_translation_and_draws_its_attention(
    translator: Model, tmp_path: Path, serving: Callable
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    translator.save_pretrained(tmp_path / "translator")
    with serving(tmp_path / "translator") as (url, _, _):
        driver = chromium()
        try:
            output = run_page(driver, url, SENTENCE, timeout=60)
            assert output and "(transformer)" in driver.find_element(By.ID, "model").text
            assert "tokens/s" in driver.find_element(By.ID, "status").text
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
