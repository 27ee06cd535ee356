"""`tf serve`'s page in a real browser: headless Chromium from Debian's `chromium` package,
driven by Playwright's Python package with `executable_path` (never a browser Playwright
downloads itself). Both are requirements of the suite, not options: `.ci/run` installs Debian's
chromium where it is missing and the `test` extra holds playwright, so where either is absent
(a laptop without `apt-get install chromium`) the test fails saying so in one line; it never
skips."""

from __future__ import annotations

import re
import shutil

import pytest
import torch
from test_serve import call, serving

from cli.inference.engines import load_engine
from cli.serving.app import build_app, read_page

pytest.importorskip("uvicorn")  # the `serve` extra, as tests/test_serve.py needs it

# Two paragraphs: the first two sentences on one line, the second one sentence over two lines.
DOCUMENT = (
    "Y dijo Dios: Sea la luz. Y fue la luz.\n\nEn el principio creó Dios\nlos cielos y la tierra.\n"
)


def chromium() -> str:
    """Debian's chromium on PATH, or the test fails in one line saying how to get it."""
    path = shutil.which("chromium")
    if path is None:
        pytest.fail(
            "the page's browser test needs Debian's chromium on PATH (apt-get install chromium; "
            ".ci/run installs it)",
            pytrace=False,
        )
    return path


def shown_translation(url: str, document: str) -> tuple[str, str]:
    """What the page at `url` shows after `document` is pasted into its box and Translate is
    clicked: the output pane's text, and that text as the browser renders it; or the test
    fails with the page's error."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the page's browser test needs playwright (pip install -e '.[test]')", False)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium())
        try:
            page = browser.new_page()
            page.goto(f"{url}/")
            page.fill("#src", document)
            page.click("#go")
            # Done: the button is back and the status says how it went.
            page.wait_for_function(
                "() => !document.getElementById('go').disabled"
                " && !document.getElementById('status').textContent.startsWith('translating')",
                timeout=60_000,
            )
            status = page.locator("#status")
            assert status.get_attribute("class") != "error", status.inner_text()
            out = page.locator("#out")
            return out.text_content(), out.inner_text()
        finally:
            browser.close()


def test_the_page_translates_a_pasted_document_keeping_its_paragraphs(trained):
    """The page sends the box as a document: it shows the server's document translation,
    whose two paragraphs (a blank line between) and line break are the source's."""
    engine = load_engine(str(trained), torch.device("cpu"), [])
    with serving(build_app(engine, str(trained), "pytorch", page=read_page())) as url:
        status, answer, _ = call(f"{url}/translate", {"format": "document", "text": DOCUMENT})
        assert status == 200, answer
        text, shown = shown_translation(url, DOCUMENT)
    assert text == answer["translation"]
    assert text.count("\n") == DOCUMENT.count("\n")  # every line break and blank line kept
    # Two paragraphs on the screen (a translation spread over two lines may leave one empty).
    paragraphs = [p for p in re.split(r"\n\s*\n", shown) if p.strip()]
    assert len(paragraphs) == 2, shown
