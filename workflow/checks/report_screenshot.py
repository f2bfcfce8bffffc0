"""Open the Snakemake HTML report in headless Chromium, check that the landing page leads
to the study table and the forest plot and that both render, that the gallery shows both
arms of each pair and that its videos play, and save screenshots.

Needs Debian's chromium and playwright (`pip install -e ".[test]"`); no browser download:
it drives /usr/bin/chromium (or $PAIRFLOW_CHROMIUM).

    python workflow/checks/report_screenshot.py results/report.html results/report-shots

Prints what it found as JSON; exits 1 when the table or a plot is not visible.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
CHROMIUM = os.environ.get("PAIRFLOW_CHROMIUM", "/usr/bin/chromium")


def _open_result(page: Any, uri: str, category: str, name: str) -> None:
    """Navigate the report's sidebar: a category, then the eye icon of one result."""
    page.goto(uri)
    page.wait_for_timeout(1000)
    page.get_by_text(category, exact=True).first.click()
    page.wait_for_timeout(600)
    page.locator("tr", has_text=name).locator("a[iconname=eye]").first.click()
    page.wait_for_timeout(1200)


GALLERY_JS = """() => [...document.querySelectorAll('.pair')].map(p => ({
  arm: p.dataset.arm, prompt: p.dataset.prompt, seed: Number(p.dataset.seed), digest: p.dataset.scoreDigest,
  images: [...p.querySelectorAll('img')].map(i => ({alt: i.alt, w: i.naturalWidth, h: i.naturalHeight,
                                                    shown: i.getBoundingClientRect().width})),
  labels: [...p.querySelectorAll('.lab')].map(l => l.innerText),
  shows: p.dataset.shows,
  videos: [...p.querySelectorAll('video')].map(v => ({label: v.closest('figure').innerText.trim(),
    ready: v.readyState, w: v.videoWidth, h: v.videoHeight, shown: v.getBoundingClientRect().width,
    time: v.currentTime, paused: v.paused, error: v.error && v.error.code})),
  links: [...p.querySelectorAll('a.mp4')].map(a => a.href),
  metrics: [...p.querySelectorAll('tr[data-metric]')].map(r => ({
    metric: r.dataset.metric, treatment: r.dataset.treatment, control: r.dataset.control, diff: r.dataset.diff,
    cells: [...r.querySelectorAll('td')].map(c => c.innerText)}))}))"""
"""What the gallery shows, read from the rendered page: per pair its arm, prompt, seed,
score-record digest, images (natural and shown size: 0 when one failed to load), the row
labels beside the images, what it shows (plays, filmstrips or numbers), its videos (label,
readyState, decoded and shown size, current time, paused, error code), its mp4 links, and
each metric row's values (attributes and the cells' text)."""


PLAYING_JS = """() => [...document.querySelectorAll('video')].every(v => v.readyState >= 2 && v.currentTime > 0
  && !v.paused)"""
"""True once every player has loaded a frame and is playing (time past 0, not paused)."""


def gallery_pairs(frame: Any, play_s: float = 0.0) -> list[dict[str, Any]]:
    """The gallery's pairs as a reader sees them (``GALLERY_JS``) in ``frame`` (a
    playwright page or frame showing gallery.html), once every image has loaded; with
    ``play_s``, read at an instant when every video plays (``PLAYING_JS``), tried for up to
    that long (after that the pairs are read as they stand, for the caller to judge).

    The check and the read are one evaluation: a looping clip seeks back to its start at
    each loop, and for that moment its time is 0 and its readyState may drop below 2, so a
    read taken apart from the check could catch a playing clip mid-seek."""
    frame.wait_for_function("() => [...document.images].every(i => i.complete)")
    snapshot = f"() => ({{playing: ({PLAYING_JS})(), pairs: ({GALLERY_JS})()}})"
    deadline = time.monotonic() + play_s
    while True:
        seen = frame.evaluate(snapshot)
        if not play_s or seen["playing"] or time.monotonic() > deadline:
            return list(seen["pairs"])
        frame.wait_for_timeout(100)


def inspect(report: Path, out: Path) -> dict[str, Any]:
    """What a reader sees: the landing page's links, the study table's headers and row
    count (inside the report's frame), and each plot's rendered size in pixels."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    uri = report.resolve().as_uri()
    found: dict[str, Any] = {"plots": {}}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(uri)
        page.wait_for_timeout(1500)
        found["landing_links"] = sorted({a.inner_text() for a in page.locator("a").all()
                                         if a.inner_text() in ("Study", "forest.png", "Plots", "Panels", "Fleet")})
        found["landing_text"] = page.get_by_text("Start here").count() > 0
        page.screenshot(path=str(out / "home.png"))
        _open_result(page, uri, "Study", "table.html")
        frame = next((f for f in page.frames if "filename=table.html" in f.url), None)
        if frame is not None:
            found["table_headers"] = [h.inner_text() for h in frame.locator("table").first.locator("th").all()]
            found["table_rows"] = frame.locator("table").first.locator("tr").count() - 1
        page.screenshot(path=str(out / "table.png"))
        _open_result(page, uri, "Gallery", "gallery.html")
        frame = next((f for f in page.frames if "filename=gallery.html" in f.url), None)
        if frame is not None:
            found["gallery"] = gallery_pairs(frame, play_s=30)
        page.screenshot(path=str(out / "gallery.png"))
        for name in ("forest.png", "latency.png", "per_prompt.png", "scatter.png"):
            _open_result(page, uri, "Plots", name)
            sizes = [img.evaluate("e => [e.naturalWidth, e.getBoundingClientRect().width, "
                                  "e.getBoundingClientRect().height]") for img in page.locator("img").all()]
            found["plots"][name] = max(sizes, key=lambda s: s[0] * s[2], default=None)
            page.screenshot(path=str(out / name))
        browser.close()
    return found


def main(report: Path, out: Path) -> int:
    found = inspect(report, out)
    print(json.dumps(found, indent=1))
    ok = found.get("table_rows", 0) > 0 and all(s and s[1] > 100 and s[2] > 100 for s in found["plots"].values())
    ok = ok and bool(found.get("gallery")) and all(i["w"] > 0 for p in found["gallery"] for i in p["images"])
    ok = ok and all(v["ready"] >= 2 and v["w"] > 0 and v["time"] > 0 and not v["paused"]
                    for p in found["gallery"] for v in p["videos"])
    print(("OK" if ok else "NOT VISIBLE") + f": screenshots in {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
