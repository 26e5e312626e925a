"""Headless Chromium reads the built book offline, as a reader would, and keeps a screenshot of each
page.

For the index and every page in _toc.yml: the math rendered (no `$$` or `\\(` left in the text, and
at least as many MathJax containers as formulas in the source), every image loaded, every internal
link resolves (file and anchor), every image outside a notebook cell is a figure with a caption and
alt text, no code block scrolls sideways at a 1,280-px window (folded blocks opened), and nothing was
fetched from the network. Screenshots:
_build/screenshots/.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.book.pages import (
    BUILD,
    HTML,
    count_formulas,
    html_path,
    markdown_text,
    source_path,
    toc_files,
)

pytestmark = pytest.mark.book
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
SCREENSHOTS = BUILD / "screenshots"

READ_PAGE = """async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  // folded helper code and solutions are read as a reader who opens them sees them
  document.querySelectorAll("main details").forEach(d => { d.open = true; });
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const images = Array.from(document.images);
  images.forEach(img => { img.loading = "eager"; });
  await Promise.all(images.map(img => img.complete ? null : new Promise(r => { img.onload = img.onerror = r; })));
  const main = (document.querySelector("main") || document.body).cloneNode(true);
  main.querySelectorAll("pre, code, script, style, mjx-container, .MathJax").forEach(e => e.remove());
  return {
    text: main.innerText,
    mathjax: document.querySelectorAll("main mjx-container").length,
    images: images.map(img => ({src: img.currentSrc || img.src, width: img.naturalWidth})),
    links: Array.from(document.querySelectorAll("a[href]")).map(a => a.href),
    uncaptioned: Array.from(document.querySelectorAll("main article img"))
      .filter(img => !img.closest(".cell"))
      .filter(img => !(img.closest("figure") && img.closest("figure").querySelector("figcaption")
                       && img.alt && !/[.](png|gif|jpe?g|svg)$/.test(img.alt)))
      .map(img => img.getAttribute("src")),
    wide_code: Array.from(document.querySelectorAll("main div.highlight pre"))
      .filter(pre => pre.scrollWidth > pre.clientWidth + 1)
      .map(pre => pre.innerText.split("\\n").reduce((a, b) => (b.length > a.length ? b : a), "")),
  };
}"""


class _Ids(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.ids.update(value for name, value in attrs if name in ("id", "name") and value)


def anchors(path: Path, memo: dict[Path, set[str]] = {}) -> set[str]:  # noqa: B006  (a cache on purpose)
    if path not in memo:
        parser = _Ids()
        parser.feed(path.read_text(errors="replace"))
        memo[path] = parser.ids
    return memo[path]


@pytest.fixture(scope="session")  # one browser per xdist worker
def browser(built_book):
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


@pytest.fixture()
def offline_page(browser):
    context = browser.new_context(offline=True, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.network_requests = []
    page.console_errors = []

    def block_network(route):
        if not route.request.url.startswith(("file:", "data:", "blob:")):
            page.network_requests.append(route.request.url)
            return route.abort()
        return route.continue_()

    page.route("**/*", block_network)
    page.on(
        "console",
        lambda message: message.type == "error" and page.console_errors.append(message.text),
    )
    yield page
    context.close()


def page_ids():
    return ["index"] + toc_files()


def html_for(doc: str) -> Path:
    return HTML / "index.html" if doc == "index" else html_path(doc)


@pytest.mark.parametrize("doc", page_ids())
def test_page_renders_offline_with_math_images_and_links(offline_page, doc):
    path = html_for(doc)
    assert path.exists(), f"{path} was not built"
    offline_page.goto(path.as_uri(), wait_until="load")
    if doc == "index":  # the root index redirects to the book's first page
        offline_page.wait_for_url(f"**/{toc_files()[0]}.html")
        offline_page.wait_for_load_state("load")
    seen = offline_page.evaluate(READ_PAGE)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    offline_page.screenshot(path=str(SCREENSHOTS / f"{doc.replace('/', '__')}.png"), full_page=True)

    for leftover in ("$$", "\\(", "\\["):
        assert leftover not in seen["text"], f"unrendered math ({leftover}) in {doc}"
    formulas = count_formulas(markdown_text(source_path(toc_files()[0] if doc == "index" else doc)))
    if formulas:
        assert seen["mathjax"] >= formulas, (
            f"{doc}: {seen['mathjax']} rendered formulas, {formulas} in the source"
        )
    broken_images = [image["src"] for image in seen["images"] if image["width"] == 0]
    assert not broken_images, f"{doc}: images that did not load: {broken_images}"
    assert not offline_page.network_requests, (
        f"{doc} asked the network for {offline_page.network_requests}"
    )
    assert not offline_page.console_errors, f"{doc} logged errors: {offline_page.console_errors}"
    broken_links = [
        link for link in seen["links"] if link.startswith("file:") and not link_resolves(link)
    ]
    assert not broken_links, f"{doc}: broken internal links: {broken_links}"
    # a chapter page's figures are numbered, with a caption and alt text (a notebook's are cell outputs)
    assert not seen["uncaptioned"], (
        f"{doc}: images without a figure caption or alt text: {seen['uncaptioned']}"
    )
    # the code column shows 100 characters (the library's line length) at a 1,280-px window
    assert not seen["wide_code"], (
        f"{doc}: code blocks that scroll sideways, longest lines: "
        + "; ".join(f"{len(line)} columns: {line[:60]!r}" for line in seen["wide_code"])
    )


def link_resolves(link: str) -> bool:
    parts = urlsplit(link)
    target = Path(unquote(parts.path))
    if target.is_dir():
        target = target / "index.html"
    if not target.exists():
        return False
    return (
        not parts.fragment or target.suffix != ".html" or unquote(parts.fragment) in anchors(target)
    )


def test_search_finds_a_chapter_offline(offline_page, built_book):
    offline_page.goto((HTML / "search.html").as_uri() + "?q=advantage", wait_until="load")
    offline_page.wait_for_selector("#search-results ul.search li", timeout=20_000)
    results = offline_page.eval_on_selector_all(
        "#search-results ul.search li a", "els => els.map(e => e.href)"
    )
    assert any(re.search(r"ch01_rl_problem", href) for href in results), results


def test_hovering_an_equation_reference_shows_the_equation_offline(offline_page):
    """Chapter 9's code section cites (9.3) far below the equation: hovering the reference shows
    the equation, typeset, without a network request (tippy.js is vendored in _static)."""
    offline_page.goto(html_path("book/ch09_reward_models").as_uri(), wait_until="load")
    offline_page.evaluate(
        "async () => { if (window.MathJax && MathJax.startup) await MathJax.startup.promise; }"
    )
    reference = offline_page.locator('a.reference[href="#equation-eq-bt-loss"]').last
    reference.scroll_into_view_if_needed()
    reference.hover()
    tip = offline_page.locator("[data-tippy-root]").first
    tip.wait_for(state="visible", timeout=10_000)
    tip.locator("mjx-container").first.wait_for(timeout=10_000)
    offline_page.wait_for_timeout(500)  # the fade-in, for the screenshot
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    offline_page.screenshot(path=str(SCREENSHOTS / "hover-equation-preview.png"))
    assert "log" in tip.inner_text() and "\N{MATHEMATICAL ITALIC SMALL SIGMA}" in tip.inner_text()
    assert not offline_page.network_requests, offline_page.network_requests
    assert not offline_page.console_errors, offline_page.console_errors
