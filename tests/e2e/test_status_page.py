"""The status page at GET / in a real headless browser (Debian's chromium), against a real stack with API keys.

Set INFERQ_STATUS_SCREENSHOT=docs/status-page.png to save the screenshot the docs show (the run then keeps the
load going a little longer, so the charts have more to draw).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.stack import Stack, new_stack, serving

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(
        "Debian's chromium is not installed at /usr/bin/chromium (apt-get install chromium); "
        "playwright is used with it and never downloads a browser",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="the dev extra's playwright is not installed")

KEY = "status-page-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODELS = ["digits", "digits-batch", "fragile", "slow"]


@contextmanager
def load(stack: Stack, pngs: list[bytes]) -> Iterator[None]:
    """Digits jobs submitted without pause, and now and then one the fragile model fails, until the block ends."""
    stop = threading.Event()

    def submit() -> None:
        with httpx.Client(base_url=stack.base, headers=AUTH, timeout=10) as client:
            sent = 0
            while not stop.is_set():
                png = pngs[sent % len(pngs)]
                client.post("/v1/models/digits/jobs", files={"file": ("d.png", png, "image/png")})
                if sent % 40 == 0:
                    client.post("/v1/models/fragile/jobs", json={"inputs": [666.0, 666.0]})
                sent += 1
                stop.wait(0.01)

    threads = [threading.Thread(target=submit, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=15)


def test_the_page_shows_the_models_and_runs_a_digit_through_the_playground(
    tmp_path: Path, digits_heldout: tuple[Any, Any]
) -> None:
    pngs, _ = digits_heldout
    digit = tmp_path / "digit.png"
    digit.write_bytes(pngs[3])
    screenshot = os.environ.get("INFERQ_STATUS_SCREENSHOT")
    with serving(new_stack(tmp_path / "stack", INFERQ_API_KEYS=KEY, INFERQ_TEST_SLOW_S="0")) as stack:
        stack.start_api()
        stack.start_worker("digits", "fragile")
        stack.wait_for_worker("digits")
        assert httpx.get(f"{stack.base}/v1/status").status_code == 401  # nothing shown without a key
        expected = httpx.post(
            f"{stack.base}/v1/models/digits/jobs",
            files={"file": ("d.png", pngs[3], "image/png")},
            headers={**AUTH, "Prefer": "wait=30"},
            timeout=40,
        ).json()["result"]["label"]

        with load(stack, pngs[:50]), sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            requested: list[str] = []
            page.on("request", lambda request: requested.append(request.url))
            page.goto(f"{stack.base}/")
            expect = sync_api.expect
            expect(page.locator("#notice")).to_contain_text("needs a key")
            expect(page.locator("[data-model]")).to_have_count(0)

            page.fill("#api-key", KEY)
            page.click("#key-form button[type=submit]")
            expect(page.locator("[data-model]")).to_have_count(len(MODELS), timeout=15_000)
            assert [page.locator("[data-model]").nth(i).get_attribute("data-model") for i in range(4)] == MODELS
            expect(page.locator("#summary")).to_contain_text("durability async")  # what a 202 promises
            card = page.locator('[data-model="digits"]')

            card.locator(".playground input[type=file]").set_input_files(digit)
            card.locator(".playground button[type=submit]").click()
            expect(card.locator(".timeline li.finished")).to_be_visible(timeout=30_000)
            expect(card.locator(".job-result-label")).to_have_text(expected)
            steps = card.locator(".timeline li").all_inner_texts()
            assert steps[0] == "queued" and steps[-1] == "finished" and "failed" not in steps

            # The charts and figures fill once a 10 s window has closed with jobs in it.
            expect(card.locator(".throughput")).not_to_have_text("0.00", timeout=40_000)
            expect(card.locator(".batch")).not_to_have_text("–")
            expect(page.locator('[data-model="fragile"] .failures li').first).to_contain_text("ModelError")
            # The one key is the one tenant: every item run is its own, and it has no quota.
            tenant = page.locator("#tenants tbody tr")
            expect(tenant).to_have_count(1)
            expect(tenant).to_contain_text("key-" + hashlib.sha256(KEY.encode()).hexdigest()[:8])
            expect(tenant).to_contain_text("100.0 %")
            expect(tenant).to_contain_text("none set")
            if screenshot:
                page.wait_for_timeout(40_000)  # more windows on the charts
            page.screenshot(path=str(tmp_path / "status-page.png"), full_page=True)
            if screenshot:
                page.screenshot(path=screenshot, full_page=True)
            browser.close()
        assert requested and all(url.startswith(stack.base) for url in requested), requested


# A json model's schema: the playground's hint used to be the same tensor for every model, [[0.1, 0.2]].
VALUES_SCHEMA = {
    "type": "object",
    "required": ["values"],
    "properties": {"values": {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0.5}, "minItems": 2}},
}
HINT = 'JSON for "inputs", e.g. '


def test_the_playground_suggests_the_input_each_model_takes(tmp_path: Path) -> None:
    stack = new_stack(tmp_path / "stack", INFERQ_TEST_SLOW_S="0")
    folder = stack.models_dir / "values"
    folder.mkdir()
    handler = "tests.support.builders:Ragged"  # {"values": [numbers]} in; each value over 0.5, doubled, out
    config = {"handler": handler, "weights": "none", "input": {"kind": "json", "schema": VALUES_SCHEMA}}
    (folder / "config.json").write_text(json.dumps(config))
    with serving(stack):
        stack.start_api()
        stack.start_worker("values")
        stack.wait_for_worker("values")
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
            page = browser.new_page()
            page.goto(f"{stack.base}/")
            expect = sync_api.expect
            expect(page.locator('[data-model="values"]')).to_have_count(1, timeout=15_000)
            hints = {
                name: page.locator(f'[data-model="{name}"] .playground textarea').get_attribute("placeholder")
                for name in ("values", "slow")
            }
            assert hints == {"values": HINT + '{"values":[0.6,0.6]}', "slow": HINT + "[0,0]"}
            expect(page.locator('[data-model="digits"] .playground input[type=file]')).to_have_count(1)
            # What it suggests runs as it is.
            card = page.locator('[data-model="values"]')
            card.locator(".playground textarea").fill(hints["values"].removeprefix(HINT))
            card.locator(".playground button[type=submit]").click()
            expect(card.locator(".timeline li.finished")).to_be_visible(timeout=30_000)
            expect(card.locator(".job-output")).to_contain_text('"count": 2')  # 0.6 doubled is over 1: both kept
            browser.close()
