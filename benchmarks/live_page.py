"""How fast the live explainer answers in a real browser, as the page itself measures it.

``attnlab explain --serve`` runs in its own process, as a user starts it; headless chromium
(Debian's, through chromium-driver) opens the page and the script reads what the page timed
with ``performance.now()`` (``#timings``):

    first paint    navigation start → the first heatmap drawn (/api/info, the first run, drawing)
    slider         a temperature change → the probabilities re-filtered and redrawn in the page
    new sentence   Run pressed on a new sentence → its answer drawn (the walk, every layer's
                   attention, the output logits, and the page drawing them)

The targets are a first paint under 1 s, a slider move under 50 ms and a new 20-token sentence
under 1 s. With ``--screenshot FILE`` it also saves the page as it looks after the runs.

    .venv/bin/python benchmarks/live_page.py --model smollm2
    .venv/bin/python benchmarks/live_page.py --model runs/demo --sentence "forty-two" \\
        --screenshot docs/live_translator.png
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = [  # 20 tokens each for SmolLM2's tokenizer
    "The old lighthouse keeper climbed the narrow stairs every single night to light the big"
    " lamp for the ships",
    "When the rain finally stopped, the children ran outside to jump in every puddle they saw"
    " out there",
    "A transformer reads all of its input at once and lets every token look at every other one"
    " of them",
    "She opened the letter slowly, afraid of what the words inside might say about her brother"
    " Tom again",
    "In the middle of the old forest there was a small lake where the deer came to drink cold"
    " water",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, port: int) -> subprocess.Popen:
    cmd = [str(ROOT / ".venv/bin/attnlab"), "explain", "--serve", "--port", str(port)]
    for flag, value in (("--model", args.model), ("--image", args.image),
                        ("--target", args.target)):
        if value:
            cmd += [flag, value]
    if args.sentence:
        cmd.append(args.sentence)
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in server.stdout:  # "open http://…" once the model is loaded
        print("  server:", line.rstrip())
        if "open http" in line:
            return server
    raise SystemExit(f"the server ended: {server.wait()}")


def browser(width: int, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def wait_ready(driver, after: str | None = None, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = driver.find_element("tag name", "body")
        if body.get_attribute("data-state") == "ready" and (
                after is None or body.get_attribute("data-run") != after):
            return
        time.sleep(0.2)  # polling the browser takes CPU from the server; the page times itself
    raise SystemExit("the page did not become ready")


def timing(driver, name: str) -> float:
    return float(driver.find_element("id", "timings").get_attribute(f"data-{name}"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="what explain --serve loads (default: a random tiny model)")
    p.add_argument("--image", help="a ViT's first image, e.g. digits:0")
    p.add_argument("--sentence", help="the page's first sentence")
    p.add_argument("--target", help="an encoder–decoder's first target prefix")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--screenshot", help="save the page, as it looks at the end, to this PNG")
    p.add_argument("--size", default="1280x1500", help="the browser window, WIDTHxHEIGHT")
    p.add_argument("--full", action="store_true", help="--screenshot the whole page")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from attnlab.hardware import report

    print(report())
    version = subprocess.run(["chromium", "--version"], capture_output=True, text=True)
    print(f"browser: {version.stdout.strip()} (headless)")
    port = free_port()
    server = start_server(args, port)
    width, height = (int(x) for x in args.size.split("x"))
    driver = browser(width, height)
    try:
        driver.get(f"http://127.0.0.1:{port}/")
        wait_ready(driver)
        first = timing(driver, "first-paint")
        kind = driver.execute_script("return window.attnlab.state.info.kind;")
        slider = []
        for i in range(args.repeats * 4):
            driver.execute_script("const e = document.getElementById('temperature');"
                                  "e.value = arguments[0];"
                                  "e.dispatchEvent(new Event('input', {bubbles: true}));",
                                  f"{0.3 + 0.07 * i:.2f}")
            slider.append(timing(driver, "slider"))
        runs, tokens = [], []
        if kind != "vision" and not args.sentence:
            for sentence in SENTENCES[: args.repeats]:
                box = driver.find_element("id", "sentence")
                box.clear()
                box.send_keys(sentence)
                before = driver.find_element("tag name", "body").get_attribute("data-run")
                driver.find_element("id", "run").click()
                wait_ready(driver, before)
                runs.append(timing(driver, "run"))
                tokens.append(len(driver.find_elements("css selector", "#tokens > *")))
        print(f"\nmodel: {args.model or 'a random tiny model'} ({kind})")
        print(f"first paint:   {first:8.1f} ms   (target < 1000)")
        print(f"slider:        {statistics.median(slider):8.2f} ms   median of {len(slider)} "
              f"moves, max {max(slider):.2f}   (target < 50)")
        if runs:
            print(f"new sentence:  {statistics.median(runs):8.1f} ms   median of {len(runs)}, "
                  f"{min(tokens)}–{max(tokens)} tokens, max {max(runs):.1f}   (target < 1000)")
        if args.screenshot:
            if args.full:  # the whole page, top to bottom
                height = driver.execute_script("return document.body.scrollHeight;")
                driver.set_window_size(width, height + 100)
                time.sleep(0.5)
            driver.execute_script("window.scrollTo(0, 0);")
            driver.save_screenshot(args.screenshot)
            print(f"screenshot: {args.screenshot}")
    finally:
        driver.quit()
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
