"""Open a built book in headless Chromium and check what a reader would notice.

    .venv/bin/python tools/check_book.py [_build/html]

For every page in _toc.yml, with every request that would leave the machine blocked (a reader
offline or behind a firewall): the page asks the network for nothing, renders with a heading,
typesets every equation (MathJax is served by the book), renders every Markdown table as a
table, cuts no line off behind a horizontal scrollbar (in a 1280-pixel window), loads every image, has every internal
link pointing at a file of the book (and same-page anchors exist), shows no error text (a
Python traceback, an error output), no script on it raises, and every dropdown (the exercises'
hints and solutions) hides its content until its title is clicked, then shows it. Prints each problem and exits 1
if there are any. Needs
``playwright`` (pip) and a Chromium binary (Debian: ``apt-get install chromium``); runs it with
--headless --no-sandbox --disable-gpu and no background networking.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-extensions",
                 "--no-first-run"]
VIEWPORT = {"width": 1280, "height": 800}  # a laptop's browser window
ERROR_MARKERS = ("Traceback (most recent call last)", "OperatorNotAllowedInGraphError")


def find_chromium() -> str | None:
    """Path of a Chromium binary, or None."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def toc_pages(toc_file: Path = ROOT / "_toc.yml") -> list[str]:
    """The book's pages in order, as paths without suffix (``book/intro``, ``notebooks/00_data``)."""
    toc = yaml.safe_load(toc_file.read_text())
    pages = [toc["root"]]
    for entry in toc.get("chapters", []):
        pages.append(entry["file"])
    return pages


_PAGE_FACTS = """
async () => {
  const images = Array.from(document.images);
  const loaded = await Promise.all(images.map(img => {
    if (img.complete && img.naturalWidth > 0) return true;
    img.loading = "eager";
    return new Promise(resolve => {
      img.addEventListener("load", () => resolve(img.naturalWidth > 0));
      img.addEventListener("error", () => resolve(false));
      setTimeout(() => resolve(img.complete && img.naturalWidth > 0), 5000);
    });
  }));
  if (window.MathJax && window.MathJax.startup && window.MathJax.startup.promise) {
    await window.MathJax.startup.promise;
  }
  const maths = Array.from(document.querySelectorAll(".math"));
  return {
    equations: maths.length,
    // Code, outputs, tables and display equations whose lines are cut off behind a horizontal scrollbar.
    cut_off: Array.from(document.querySelectorAll(
        "article pre, .pst-scrollable-table-container, .table-wrapper, article mjx-container[display='true']"))
      .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent.trim().slice(0, 60)),
    untypeset: maths.filter(m => !m.querySelector("mjx-container")).map(m => m.textContent.slice(0, 40)),
    // A Markdown table printed as text (its |---| delimiter row in a paragraph): a text/markdown
    // output rendered as CommonMark, which has no tables.
    raw_tables: Array.from(document.querySelectorAll("main p, article p"))
      .filter(p => /\|\s*:?-{3,}:?\s*\|/.test(p.textContent)).map(p => p.textContent.trim().slice(0, 60)),
    heading: (document.querySelector("main h1, article h1, h1") || {}).textContent || "",
    images: images.map((img, i) => ({src: img.getAttribute("src"), ok: loaded[i]})),
    links: Array.from(document.querySelectorAll("main a[href], article a[href]")).map(a => a.getAttribute("href")),
    // The theme's download menu: the page's source (a chapter's .ipynb), served by the book itself.
    downloads: Array.from(document.querySelectorAll("a.btn-download-source-button[href]")).map(a => a.getAttribute("href")),
    ids: Array.from(document.querySelectorAll("[id]")).map(e => e.id),
    text: document.body.textContent,
    errors: document.querySelectorAll(".output.traceback, .output.error, .output.stderr").length,
  };
}
"""


# Each dropdown admonition (sphinx-togglebutton, served by the book): is its content hidden, and
# does a click on its title show it? Returns one entry per dropdown.
_DROPDOWNS = """
async () => {
  const visible = e => !!e && e.getClientRects().length > 0 && getComputedStyle(e).visibility !== "hidden";
  const results = [];
  for (const box of Array.from(document.querySelectorAll(".admonition.dropdown"))) {
    const title = box.querySelector(".admonition-title");
    const body = Array.from(box.children).find(child => child !== title);
    const name = (title ? title.textContent : "").trim().slice(0, 40);
    const hidden = !visible(body);
    if (title) title.click();
    await new Promise(resolve => setTimeout(resolve, 50));
    results.push({name: name, hidden_first: hidden, shown_after_click: visible(body)});
  }
  return results;
}
"""


# Each precomputed explorer (widgets.static_explorer): move every slider to its last position, then
# to its first, and read which frame is shown and what it holds. Returns one entry per explorer.
_EXPLORERS = """
async () => {
  const results = [];
  for (const root of Array.from(document.querySelectorAll(".vcd-explorer"))) {
    const inputs = Array.from(root.querySelectorAll("input[type=range]"));
    const visible = () => Array.from(root.querySelectorAll(".vcd-frame")).filter(f => !f.hidden && f.getClientRects().length > 0);
    const state = () => ({key: inputs.map(i => i.value).join("|"), shown: visible().map(f => f.dataset.key),
                          content: visible().map(f => f.innerHTML.length + ":" + f.innerHTML.slice(-80)).join(),
                          readouts: inputs.map(i => i.nextElementSibling.textContent)});
    const moves = [state()];
    for (const input of inputs) {
      for (const position of [input.max, input.min]) {
        input.value = position;
        input.dispatchEvent(new Event("input", {bubbles: true}));
        await new Promise(resolve => setTimeout(resolve, 20));
        moves.push(state());
      }
    }
    results.push({id: root.id, sliders: inputs.length, frames: root.querySelectorAll(".vcd-frame").length, moves: moves});
  }
  return results;
}
"""


def _explorer_problems(name: str, explorer: dict) -> list[str]:
    """What is wrong with one explorer's recorded slider moves (see _EXPLORERS)."""
    where = f"{name}: explorer {explorer['id']}"
    if not explorer["sliders"]:
        return [f"{where} has no slider"]
    problems = []
    for move in explorer["moves"]:
        if move["shown"] != [move["key"]]:
            problems.append(f"{where} shows frame(s) {move['shown']} for slider positions {move['key']}")
    if len({move["content"] for move in explorer["moves"]}) < 2:
        problems.append(f"{where}: moving its sliders does not change what it shows")
    if len({tuple(move["readouts"]) for move in explorer["moves"]}) < 2:
        problems.append(f"{where}: its sliders' readouts do not follow them")
    return problems


def check_book(html_dir: Path, pages: list[str], chromium: str) -> list[str]:
    """Problems found in the built book (an empty list when it is fine)."""
    from playwright.sync_api import sync_playwright

    problems = []
    html_dir = html_dir.resolve()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        script_errors: list[str] = []
        page.on("pageerror", lambda error: script_errors.append(str(error).splitlines()[0]))
        network: list[str] = []

        def offline(route) -> None:
            if route.request.url.startswith(("file:", "data:", "blob:")):
                route.continue_()
            else:
                network.append(route.request.url)
                route.abort()
        page.route("**/*", offline)
        for name in pages:
            path = html_dir / f"{name}.html"
            if not path.exists():
                problems.append(f"{name}: page missing ({path})")
                continue
            script_errors.clear()
            network.clear()
            page.goto(path.as_uri(), wait_until="load")
            facts = page.evaluate(_PAGE_FACTS)
            problems += [f"{name}: script error: {error}" for error in script_errors]
            problems += [f"{name}: asks the network for {url}" for url in dict.fromkeys(network)]
            problems += [f"{name}: equation not typeset: {text!r}" for text in facts["untypeset"]]
            problems += [f"{name}: lines cut off behind a horizontal scrollbar: {text!r}" for text in facts["cut_off"]]
            problems += [f"{name}: a Markdown table shown as text: {text!r}" for text in facts["raw_tables"]]
            if not facts["heading"].strip():
                problems.append(f"{name}: no heading rendered")
            for image in facts["images"]:
                if not image["ok"]:
                    problems.append(f"{name}: image does not load: {image['src']}")
            for marker in ERROR_MARKERS:
                if marker in facts["text"]:
                    problems.append(f"{name}: error text on the page: {marker!r}")
            if facts["errors"]:
                problems.append(f"{name}: {facts['errors']} error/stderr output block(s)")
            for href in facts["links"]:
                problems += _check_link(name, path, href, set(facts["ids"]), html_dir)
            if name.startswith("notebooks/") and not any(h.endswith(".ipynb") for h in facts["downloads"]):
                problems.append(f"{name}: no download of its notebook (.ipynb)")
            for href in facts["downloads"]:
                problems += _check_link(name, path, href, set(), html_dir)
            for explorer in page.evaluate(_EXPLORERS):
                problems += _explorer_problems(name, explorer)
            for dropdown in page.evaluate(_DROPDOWNS):
                if not dropdown["hidden_first"]:
                    problems.append(f"{name}: dropdown {dropdown['name']!r} shows its content before a click")
                elif not dropdown["shown_after_click"]:
                    problems.append(f"{name}: dropdown {dropdown['name']!r} does not open when its title is clicked")
        browser.close()
    return problems


def _check_link(name: str, page_path: Path, href: str, ids: set[str], html_dir: Path) -> list[str]:
    parsed = urlparse(href)
    if parsed.scheme in ("http", "https", "mailto") or href.startswith("//"):
        return []  # external: not checked offline
    if parsed.scheme not in ("", "file"):
        return []
    if not parsed.path:
        fragment = unquote(parsed.fragment)
        return [] if not fragment or fragment in ids else [f"{name}: anchor #{fragment} not on the page"]
    target = (page_path.parent / unquote(parsed.path)).resolve()
    if target.is_dir():
        target = target / "index.html"
    if not target.exists():
        return [f"{name}: broken internal link {href}"]
    if html_dir not in target.parents and target != html_dir:
        return [f"{name}: link leaves the book: {href}"]
    return []


def main() -> int:
    html_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "_build" / "html"
    chromium = find_chromium()
    if chromium is None:
        print("no Chromium found (apt-get install chromium); cannot check the book")
        return 2
    problems = check_book(html_dir, toc_pages(), chromium)
    for problem in problems:
        print(problem)
    print(f"checked {len(toc_pages())} pages in {html_dir}: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
