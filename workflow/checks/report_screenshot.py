"""Documented check: open the Snakemake HTML report in headless Chromium and screenshot
the study table and a plot. Needs Debian's chromium and `pip install playwright` (no
browser download: it drives /usr/bin/chromium).

    python workflow/checks/report_screenshot.py results/report.html results/report-shots
"""

import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def main(report: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(report.resolve().as_uri())
        page.wait_for_timeout(1500)
        page.screenshot(path=str(out / "home.png"))
        for category, item, name in (("Plots", "forest.png", "forest"), ("Plots", "per_prompt.png", "per_prompt"),
                                     ("Study", "table.html", "table")):
            page.get_by_text(category, exact=True).first.click()
            page.wait_for_timeout(800)
            page.locator("tr", has_text=item).locator("a[iconname=eye]").first.click()
            page.wait_for_timeout(1500)
            page.screenshot(path=str(out / f"{name}.png"))
            page.goto(report.resolve().as_uri())
            page.wait_for_timeout(1000)
        browser.close()
    print("screenshots in", out)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
