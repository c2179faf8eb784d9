"""Screenshot every console page of a running Backstop (e.g. `bin/demo`) into this folder.

    .venv/bin/python docs/screenshots/take.py --password "$(python3 -c 'import json; \
        print(json.load(open("var/demo-passwords.json"))["operator"])')" --job 1

Uses the system Chromium (/usr/bin/chromium) through Playwright; never downloads a browser.
The browser test (tests/dash/test_browser.py) takes the same shots from seeded test data.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from playwright.sync_api import sync_playwright

HERE = Path(__file__).resolve().parent
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def main() -> None:
    """Log in, open each page, wait for its data, save <page>.png next to this script."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--user", default="operator")
    parser.add_argument("--password", required=True)
    parser.add_argument("--job", type=int, required=True, help="job id for the job page")
    args = parser.parse_args()
    pages = {
        "overview": ("/console/", "#jobs"),
        "job": (f"/console/jobs/{args.job}/", "#operators"),
        "placement": ("/console/placement/", ".node-card"),
        "recoveries": ("/console/recoveries/", "#timelines .main-svg"),
        "resources": ("/console/resources/", "#resources .main-svg"),
    }
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS
        )
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.set_default_timeout(30_000)
        page.goto(f"{args.url}/accounts/login/?next=/console/")
        page.fill("input[name=username]", args.user)
        page.fill("input[name=password]", args.password)
        page.click("button[type=submit]")
        page.wait_for_url(f"{args.url}/console/")
        for name, (path, ready) in pages.items():
            page.goto(f"{args.url}{path}")
            page.wait_for_selector(ready)
            page.wait_for_timeout(2500)  # one more refresh, and plotly done drawing
            page.screenshot(path=str(HERE / f"{name}.png"), full_page=True)
            print(f"saved {HERE / f'{name}.png'}")
        browser.close()


if __name__ == "__main__":
    main()
