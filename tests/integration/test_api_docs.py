"""The API docs pages work without internet: every asset they load is served by inferq itself."""

from __future__ import annotations

import asyncio
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from inferq.api.app import create_app
from inferq.shared.settings import Settings
from tests.support.models import make_models_dir

BASE = "http://inferq"


class Assets(HTMLParser):
    """Every URL a page loads by itself: scripts, stylesheets and icons, images."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        attribute = {"script": "src", "link": "href", "img": "src"}.get(tag)
        if attribute and named.get(attribute):
            self.urls.append(str(named[attribute]))


@pytest.fixture
def settings(tmp_path: Path, redis_url: str) -> Settings:
    return Settings(redis_url=redis_url, models_dir=make_models_dir(tmp_path / "models"))


def fetch_page_and_assets(settings: Settings, page: str) -> tuple[httpx.Response, dict[str, httpx.Response]]:
    async def run() -> tuple[httpx.Response, dict[str, httpx.Response]]:
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
                html = await client.get(page)
                parser = Assets()
                parser.feed(html.text)
                assets = {url: await client.get(urljoin(f"{BASE}{page}", url)) for url in parser.urls}
                return html, assets

    return asyncio.run(run())


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_only_assets_the_api_serves(settings: Settings, page: str) -> None:
    html, assets = fetch_page_and_assets(settings, page)
    assert html.status_code == 200
    assert html.headers["content-type"].startswith("text/html")
    # A script and at least a stylesheet or icon: the page is more than a bare shell.
    assert len(assets) >= 2, html.text
    assert any(url.endswith(".js") for url in assets), html.text
    for url, response in assets.items():
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc, f"{page} loads {url} from another host"
        assert response.status_code == 200, url
        assert response.content, url
    # Nor does the page's own script reach out (Swagger UI's default validator badge would).
    assert re.findall(r"https?://[^\s'\"<>]+", html.text) == []


def test_the_swagger_page_reads_this_apis_schema(settings: Settings) -> None:
    html, _ = fetch_page_and_assets(settings, "/docs")
    assert "url: '/openapi.json'" in html.text
    # Swagger UI's default validator would put a badge from validator.swagger.io on the page.
    assert '"validatorUrl": null' in html.text
