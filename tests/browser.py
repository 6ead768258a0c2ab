"""A real browser for the report's tests: Debian's headless Chromium driven by Selenium through Debian's
chromedriver (`make browser` installs both). Never a downloaded browser: Selenium gets both paths, so its
driver manager has nothing to fetch.

Also a command, for README's screenshot: `python -m tests.browser RUN/report.html docs/report.png [HEIGHT]`.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import sys
from pathlib import Path

CHROMIUM = ("chromium", "chromium-browser")
CHROMEDRIVER = "chromedriver"
WIDTH = 1280  # a laptop screen's width; the page's column is narrower, so nothing is cut


def find() -> tuple[str, str] | None:
    """(chromium, chromedriver) paths, or None when either is missing."""
    browser = next((p for p in map(shutil.which, CHROMIUM) if p), None)
    driver = shutil.which(CHROMEDRIVER)
    return (browser, driver) if browser and driver else None


@contextlib.contextmanager
def chromium(width: int = WIDTH, height: int = 900):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    paths = find()
    if paths is None:
        raise RuntimeError("chromium and chromedriver are not installed: `make browser` (apt-get install -y chromium "
                           "chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = paths[0]
    # --no-sandbox: CI containers run as root, where Chromium's sandbox refuses to start
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                f"--window-size={width},{height}", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(paths[1]), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


# Resolves with the images that failed to decode: `complete` and a natural width are checked after `decode()`,
# which rejects for a broken or undecodable image.
CHECK_IMAGES = """
const done = arguments[arguments.length - 1];
const imgs = Array.from(document.images);
Promise.all(imgs.map((im, i) => im.decode().then(() => null, () => i))).then(failed => done({
  count: imgs.length,
  failed: imgs.map((im, i) => (failed[i] !== null || !im.complete || im.naturalWidth === 0) ? im.alt : null)
              .filter(x => x !== null)}));
"""


def load(driver, html_path: Path) -> dict:
    """Open the page from disk; {'images': count, 'broken': [alt, ...], 'errors': [console errors], 'scripts': n}."""
    driver.get(Path(html_path).resolve().as_uri())
    driver.set_script_timeout(30)
    images = driver.execute_async_script(CHECK_IMAGES)
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    scripts = driver.execute_script("return document.scripts.length")
    return {"images": images["count"], "broken": images["failed"], "errors": errors, "scripts": scripts}


def screenshot(driver, png_path: Path, height: int | None = None) -> Path:
    """The page from the top, `height` pixels tall (None: the whole page)."""
    full = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(WIDTH, min(full, height) if height else full)
    Path(png_path).parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(png_path))
    return Path(png_path)


def main(argv: list[str]) -> None:
    from PIL import Image

    html_path, png_path = Path(argv[0]), Path(argv[1])
    height = int(argv[2]) if len(argv) > 2 else None
    with chromium() as driver:
        result = load(driver, html_path)
        if result["broken"] or result["errors"]:
            raise SystemExit(f"{html_path}: broken images {result['broken']}, console errors {result['errors']}")
        screenshot(driver, png_path, height)
    # An adaptive palette of 256 colours keeps text and figures sharp and the PNG a fraction of the RGB size.
    im = Image.open(png_path).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    buf = io.BytesIO()
    im.save(buf, format="PNG", optimize=True)
    png_path.write_bytes(buf.getvalue())
    print(f"wrote {png_path} ({len(buf.getvalue()) / 1e3:.0f} KB, {im.size[0]}x{im.size[1]}); {result['images']} images decoded")


if __name__ == "__main__":
    main(sys.argv[1:])
