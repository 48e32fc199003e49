"""The live page in a real browser: Debian's headless chromium driven through chromium-driver
(selenium), against ``explain --serve``'s app on 127.0.0.1 on a free port, reading what the
page shows (the DOM) and comparing it with independent references: the model's own softmax at
the temperature set, a copy of the model with a head's columns of W_O zeroed, the token
``attnlab generate`` draws with the same seed, and torch's ``filter_logits``."""

from __future__ import annotations

import copy
import math
import shutil

import pytest
import torch

from attnlab.explain.live.session import Session
from attnlab.generation.decode import filter_logits
from tests.cli.helpers import cli_captured
from tests.explain.live.conftest import LiveServer

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
WAIT = 30  # seconds any step may take: tests never assert timings

pytestmark = pytest.mark.skipif(
    BROWSER is None or DRIVER is None,
    reason="needs Debian's chromium and chromium-driver (.ci/run installs both)")


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = BROWSER
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--window-size=1300,1800"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_script_timeout(WAIT)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def page(browser, char_lm):
    server = LiveServer(Session(str(char_lm.folder), sentence="the quick brown fox"))
    browser.get(server.url + "/")
    ready(browser)
    yield browser
    server.close()


def ready(driver, after: str | None = None) -> None:
    """Wait until the page is idle (and, given ``after``, showing a newer run than that)."""
    from selenium.webdriver.support.ui import WebDriverWait

    def idle(d) -> bool:
        body = d.find_element("tag name", "body")
        state, run = body.get_attribute("data-state"), body.get_attribute("data-run")
        return state in ("ready", "error") and (after is None or run != after)

    WebDriverWait(driver, WAIT).until(idle)


def current_run(driver) -> str:
    return driver.find_element("tag name", "body").get_attribute("data-run")


def set_value(driver, element_id: str, value) -> None:
    """Set an input as a user would leave it, and fire its ``input`` event."""
    driver.execute_script("const e = document.getElementById(arguments[0]);"
                          "e.value = arguments[1];"
                          "e.dispatchEvent(new Event('input', {bubbles: true}));",
                          element_id, str(value))


def type_sentence(driver, text: str) -> None:
    box = driver.find_element("id", "sentence")
    box.clear()
    box.send_keys(text)
    before = current_run(driver)
    driver.find_element("id", "run").click()
    ready(driver, after=before)


def shown_probabilities(driver) -> dict[int, float]:
    rows = driver.find_elements("css selector", "#probs tr.cand")
    return {int(r.get_attribute("data-id")): float(r.get_attribute("data-p")) for r in rows}


def test_the_page_shows_the_models_softmax_at_the_temperature_set(page, char_lm):
    sentence = "pack my box with five"
    type_sentence(page, sentence)
    assert page.find_element("tag name", "body").get_attribute("data-state") == "ready"
    chips = [c.text for c in page.find_elements("css selector", "#tokens > *")]
    assert len(chips) == len(sentence)
    ids = torch.tensor([char_lm.tokenizer.encode(sentence)])
    with torch.no_grad():
        logits = char_lm.model(ids)[0, -1].double()
    for temperature in (0.7, 1.6):
        set_value(page, "temperature", temperature)
        shown = shown_probabilities(page)
        expected = (logits / temperature).softmax(-1)
        assert len(shown) == min(10, len(logits))
        assert list(shown) == expected.topk(len(shown)).indices.tolist()
        for i, p in shown.items():
            assert p == pytest.approx(float(expected[i]), abs=1e-4)
    set_value(page, "top-k", 3)
    assert len(shown_probabilities(page)) == 3
    set_value(page, "top-k", "")
    timings = page.find_element("id", "timings")
    for name in ("data-first-paint", "data-slider", "data-run"):
        assert float(timings.get_attribute(name)) >= 0  # measured, not asserted


def test_switching_a_head_off_changes_the_prediction_as_ablation_computes(page, char_lm):
    sentence = "the lazy dog jumps over"
    type_sentence(page, sentence)
    layer_select = page.find_element("id", "layer")
    before = current_run(page)
    page.execute_script("const s = document.getElementById('layer'); s.value = '1';"
                        "s.dispatchEvent(new Event('change', {bubbles: true}));")
    ready(page)
    assert layer_select.get_attribute("value") == "1"
    before = current_run(page)
    page.find_element("css selector", "#heads .thumb[data-head='2'] button.off").click()
    ready(page, after=before)
    assert "ablated" in page.find_element(
        "css selector", "#heads .thumb[data-head='2']").get_attribute("class")
    rows = page.find_elements("css selector", "#ablation tr.after")
    shown = [(r.get_attribute("data-token"), float(r.get_attribute("data-p"))) for r in rows]
    ids = torch.tensor([char_lm.tokenizer.encode(sentence)])
    cut = copy.deepcopy(char_lm.model)
    attn = cut.blocks.layers[1].self_attn
    with torch.no_grad():
        attn.out_proj.weight[:, 2 * attn.d_k : 3 * attn.d_k] = 0  # head 2's output, zeroed
        after = cut(ids)[0, -1].softmax(-1)
    top = after.topk(5)
    assert [t for t, _ in shown] == [char_lm.tokenizer.decode([int(i)]) for i in top.indices]
    for (_, p), q in zip(shown, top.values.tolist(), strict=True):
        assert p == pytest.approx(q, abs=1e-4)
    before = current_run(page)  # switch it back on: the ablation table goes
    page.find_element("css selector", "#heads .thumb[data-head='2'] button.off").click()
    ready(page, after=before)
    assert not page.find_elements("css selector", "#ablation tr.after")


def test_next_token_appends_what_attnlab_generate_draws(page, char_lm):
    sentence = "the quick brown"
    type_sentence(page, sentence)
    set_value(page, "temperature", 0.9)
    set_value(page, "seed", 1234)
    before = current_run(page)
    page.find_element("id", "next").click()
    ready(page, after=before)
    assert page.find_element("id", "seed-used").text == "1234"
    appended = page.find_element("id", "sentence").get_attribute("value")
    assert appended.startswith(sentence) and len(appended) == len(sentence) + 1
    r = cli_captured("generate", "--model", char_lm.folder, "--prompt", sentence,
                     "--max-new-tokens", "1", "--temperature", "0.9", "--seed", "1234",
                     "--device", "cpu", "--precision", "fp32", "--no-compile")
    assert r.code == 0, r.err
    assert r.out.rstrip("\n") == appended
    # the page ran again on the longer text: its attention has one position more
    assert len(page.find_elements("css selector", "#tokens > *")) == len(appended)


def test_bad_input_shows_a_message_and_the_page_keeps_working(page):
    """An empty sentence and one over --max-tokens: the server's line on the page (a head or an
    image the model cannot take never leaves the page's controls; the API refuses those,
    tests/explain/live/test_app.py), and the next good sentence runs."""
    from selenium.webdriver.support.ui import WebDriverWait

    for text, words in (("", "empty"), ("x" * 200, "at most 128")):
        page.execute_script("document.getElementById('sentence').value = arguments[0];", text)
        page.find_element("id", "run").click()
        WebDriverWait(page, WAIT).until(
            lambda d, words=words: d.find_element("id", "error").is_displayed()
            and words in d.find_element("id", "error").text)
        ready(page)
    box = page.find_element("id", "sentence")
    box.clear()
    box.send_keys("five dozen")
    before = current_run(page)
    page.find_element("id", "run").click()
    ready(page, after=before)
    assert not page.find_element("id", "error").is_displayed()
    assert page.find_element("tag name", "body").get_attribute("data-state") == "ready"
    assert len(page.find_elements("css selector", "#tokens > *")) == len("five dozen")


CASES = [  # (logits, temperature, top_k, top_p): ties at the k-th logit, top-p's exact edge
    ([2.0, 1.0, 1.0, 1.0, -1.0, 0.5], 1.0, 2, None),
    ([2.0, 1.0, 1.0, 1.0, -1.0, 0.5], 0.5, 4, 0.8),
    ([math.log(0.5), math.log(0.25), math.log(0.125), math.log(0.125)], 1.0, None, 0.75),
    ([0.0, 0.0, 0.0, 0.0], 1.0, None, 0.5),  # uniform: the edge falls on ties
    ([0.0, 0.0, 0.0, 0.0], 1.0, None, 0.50001),
    ([3.0, -math.inf, 1.0, 2.5, 2.5, 0.0], 1.3, None, 0.9),
    ([1.5, 0.2, -0.7, 3.1, 3.1, 0.9, -2.0], 2.0, 3, 0.6),
    ([1.5, 0.2, -0.7, 3.1, 3.1, 0.9, -2.0], 0.25, None, None),
]


def test_the_pages_filter_is_attnlabs(page):
    """window.attnlab.filter, which the sliders run, against generate's filter_logits."""
    for logits, temperature, top_k, top_p in CASES:
        shown = page.execute_script(
            "const x = arguments[0].map(v => v === null ? -Infinity : v);"
            "return Array.from(window.attnlab.filter(x, arguments[1], arguments[2], "
            "arguments[3]));",
            [None if v == -math.inf else v for v in logits], temperature, top_k, top_p)
        x = torch.tensor(logits, dtype=torch.float64)
        expected = filter_logits(x / temperature, top_k, top_p).softmax(-1)
        assert [p > 0 for p in shown] == (expected > 0).tolist(), (logits, top_k, top_p)
        torch.testing.assert_close(torch.tensor(shown, dtype=torch.float64), expected,
                                   rtol=0, atol=1e-6)
    # greedy: nothing is cut, the probabilities are shown at T = 1
    shown = page.execute_script("return Array.from(window.attnlab.filter([1, 2, 3], 0, 1, "
                                "0.1));")
    torch.testing.assert_close(torch.tensor(shown, dtype=torch.float64),
                               torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64).softmax(-1))


def open_page(driver, session):
    server = LiveServer(session)
    driver.get(server.url + "/")
    ready(driver)
    return server


def choose_option(driver, element_id: str, value: str) -> None:
    driver.execute_script("const s = document.getElementById(arguments[0]); s.value = arguments[1];"
                          "s.dispatchEvent(new Event('change', {bubbles: true}));",
                          element_id, value)


def test_an_encoder_decoder_page_shows_cross_attention_and_switches_a_cross_head_off(browser):
    """A random tiny translator: the target box, the cross-attention view (target × source),
    and a cross-attention head switched off against a copy with its W_O columns zeroed; the
    heatmap saved as SVG holds one cell per weight."""
    session = Session(None, sentence="the cat sat on the mat", target="the")
    server = open_page(browser, session)
    try:
        assert browser.find_element("id", "target").is_displayed()
        assert browser.find_element("id", "target").get_attribute("value") == "the"
        choose_option(browser, "view", "cross")
        source = len(session.tokenizer.encode("the cat sat on the mat", add_eos=True))
        cells = browser.find_elements("css selector", "#heatmap rect")
        assert len(cells) == 2 * source  # the start token and "the", × the source tokens
        svg = browser.execute_script("return heatmapSVG();")  # what "Save heatmap (SVG)" saves
        assert svg.startswith("<svg") and svg.count("<rect") == 2 * source
        before = current_run(browser)
        browser.find_element("css selector", "#heads .thumb[data-head='1'] button.off").click()
        ready(browser, after=before)
        rows = browser.find_elements("css selector", "#ablation tr.after")
        shown = [float(r.get_attribute("data-p")) for r in rows]
        model = copy.deepcopy(session.model)
        attn = model.decoder.layers[0].cross_attn
        src = torch.tensor([session.tokenizer.encode("the cat sat on the mat", add_eos=True)])
        tgt = torch.tensor([[model.config.bos_id] + session.tokenizer.encode("the")])
        with torch.no_grad():
            attn.out_proj.weight[:, attn.d_k : 2 * attn.d_k] = 0
            logits = model(src, tgt)[0, -1]
        logits[model.config.pad_id] = float("-inf")
        top = logits.softmax(-1).topk(len(shown)).values.tolist()
        assert shown == pytest.approx(top, abs=1e-4)
    finally:
        server.close()


def test_a_digit_page_shows_the_class_probabilities_and_the_rollout(browser):
    from attnlab.data.images import load_digits

    session = Session(None, image="digits:0")
    server = open_page(browser, session)
    try:
        assert browser.find_element("id", "digit").is_displayed()
        assert browser.find_element("id", "rollout-view").is_displayed()
        shown = shown_probabilities(browser)
        with torch.no_grad():
            p = session.model(load_digits().test.images[0:1])[0].softmax(-1)
        assert list(shown) == p.topk(len(shown)).indices.tolist()
        for i, q in shown.items():
            assert q == pytest.approx(float(p[i]), abs=1e-4)
        assert not browser.find_element("id", "next").is_displayed()
    finally:
        server.close()
