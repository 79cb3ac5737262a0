"""The demo app served for real: in a headless Chromium (type a prompt, generate, and read back both sides
and their scores), and through its HTTP API as anyone who reaches the server can call it.

The browser test needs Debian's ``chromium`` and ``chromium-driver`` (``bash scripts/setup_browser.sh``)
and the ``selenium`` package (the ``dev`` extra); without them it fails and says so.
"""

import io
import json
import re
import socket
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from app_runs import make_run
from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from app.app import DISPLAY_SIZE, launch
from app.prompts import parse_prompt
from flowrl.generate import generate
from flowrl.models import SHIPPED_MODELS, load_shapes_model
from rewards import MultiReward

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
#: Headless, and quiet on a closed network (no background fetches that would stall the page).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1600,1400",
)
PROMPT = "a red circle and a blue square"
NUM_IMAGES, NUM_STEPS = 4, 20  # the app's defaults, with seeds 0, 1, 2, 3


pytestmark = pytest.mark.usefixtures("one_thread")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def browser(tmp_path):
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        pytest.fail(
            f"headless browser not installed ({', '.join(missing)} missing): run bash scripts/setup_browser.sh"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    yield driver
    driver.quit()


def _score_rows(driver, side: str) -> list[dict[str, float]]:
    rows = driver.find_elements(By.CSS_SELECTOR, f'.flowrl-scores[data-side="{side}"] .card')
    return [
        {
            cell.get_attribute("data-label"): float(cell.get_attribute("data-value"))
            for cell in row.find_elements(By.CSS_SELECTOR, ".score")
        }
        for row in rows
    ]


def _gallery_images(driver, side: str) -> list[np.ndarray]:
    """The displayed images of a side, fetched from the server and shrunk back to the model's pixels."""
    sources = [
        img.get_attribute("src") for img in driver.find_elements(By.CSS_SELECTOR, f"#{side}-gallery img")
    ]
    images = []
    for source in sources:
        assert source.startswith("http://127.0.0.1:"), source
        with urllib.request.urlopen(source, timeout=10) as response:
            image = np.asarray(Image.open(io.BytesIO(response.read())).convert("RGB"))
        assert image.shape == (DISPLAY_SIZE, DISPLAY_SIZE, 3)
        images.append(image)
    return images


def _both_sides_shown(driver) -> bool:
    return all(
        len(_score_rows(driver, side)) == NUM_IMAGES
        and len(driver.find_elements(By.CSS_SELECTOR, f"#{side}-gallery img")) == NUM_IMAGES
        for side in ("base", "tuned")
    )


def test_generate_in_a_browser_shows_both_sides_and_the_rewards_scores(browser, tmp_path):
    # The shipped base model and a slightly perturbed copy of it as the run: real shapes, varied scores.
    base = "shapes-base"
    run = make_run(tmp_path / "runs" / "run", SHIPPED_MODELS[base], load_shapes_model(base), noise=0.002)
    port = _free_port()
    demo = launch(str(run), base, tmp_path / "runs", port=port, block=False)
    try:
        assert demo.local_url == f"http://127.0.0.1:{port}/"  # loopback unless told otherwise
        browser.get(demo.local_url)
        wait = WebDriverWait(browser, 30)
        prompt = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#prompt textarea"))
        prompt.send_keys(Keys.CONTROL, "a")
        prompt.send_keys(PROMPT)
        browser.find_element(By.ID, "generate").click()
        wait.until(_both_sides_shown)

        # What the reward computes for the tuned model's images of these seeds...
        record = parse_prompt(PROMPT)
        seeds = list(range(NUM_IMAGES))
        images = generate(load_shapes_model(str(run / "model")), [PROMPT] * NUM_IMAGES, seeds, NUM_STEPS, 1.0)
        reward = MultiReward({"shapes_verifier": 1.0})
        expected = reward(images, [PROMPT] * NUM_IMAGES, [record] * NUM_IMAGES)
        totals = reward.total(expected)
        # ...are the images the page shows (enlarged without smoothing, 8-bit)...
        scale = DISPLAY_SIZE // images.shape[-1]
        shown = np.stack([image[::scale, ::scale] for image in _gallery_images(browser, "tuned")])
        pixels = (images * 255).round().permute(0, 2, 3, 1).numpy()
        assert np.abs(shown.astype(np.float32) - pixels).max() <= 1
        # ...and the scores under them.
        rows = _score_rows(browser, "tuned")
        assert len({row["reward"] for row in rows}) > 1  # varied scores, not a trivial match
        for index, row in enumerate(rows):
            assert row == {
                **{label: float(values[index]) for label, values in expected.items()},
                "reward": float(totals[index]),
            }
        verdicts = browser.find_elements(By.CSS_SELECTOR, '.flowrl-scores[data-side="tuned"] .verdict')
        assert len(verdicts) == NUM_IMAGES
        assert re.search(r"1 red circle: \d+ circles? (✓|✗|0\.\d\d), \d+/\d+ red ", verdicts[0].text)
        assert PROMPT in browser.find_element(By.ID, "status").text
        screenshot = tmp_path / "app.png"
        assert browser.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 10_000
    finally:
        demo.close()
    with pytest.raises(OSError):  # the server is stopped
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def _call(url: str, api_name: str, *data: Any) -> tuple[str, Any]:
    """One call of the app's HTTP API, as any client can make it: ``(event, data)`` of its result,
    the event ``complete`` or ``error``."""
    posted = httpx.post(f"{url}gradio_api/call/{api_name}", json={"data": list(data)}, timeout=30)
    posted.raise_for_status()
    stream = httpx.get(f"{url}gradio_api/call/{api_name}/{posted.json()['event_id']}", timeout=120)
    lines = stream.text.splitlines()
    ends = [i for i, line in enumerate(lines) if line in ("event: complete", "event: error")]
    assert ends, stream.text
    return lines[ends[-1]].removeprefix("event: "), json.loads(lines[ends[-1] + 1].removeprefix("data: "))


def test_the_http_api_loads_only_offered_runs_and_runs_no_run_code(tmp_path, tiny_model, tiny_model_dir):
    # An exploit found against the app: a run folder whose config.yaml makes the reward registry run a shell command,
    # submitted as the tuned model through the API (which bypasses the page's dropdown).
    marker = tmp_path / "pwned"
    shell = {"pwn": {"reward": "subprocess:Popen", "settings": {"args": f"touch {marker}", "shell": True}}}
    root = tmp_path / "runs"
    run = make_run(root / "run", tiny_model_dir, tiny_model)
    # One under the runs root (as if copied in from elsewhere), one crafted anywhere else on the server.
    evil = make_run(root / "evil", tiny_model_dir, tiny_model, rewards=shell)
    crafted = make_run(tmp_path / "elsewhere" / "crafted", tiny_model_dir, tiny_model, rewards=shell)
    demo = launch(None, str(tiny_model_dir), root, port=_free_port(), block=False)
    try:
        url = demo.local_url
        endpoints = httpx.get(f"{url}gradio_api/info").json()["named_endpoints"]
        assert {"/generate", "/run_overview"} <= set(endpoints)
        config = yaml.safe_dump({"rewards": shell}).encode()
        uploaded = httpx.post(f"{url}gradio_api/upload", files={"files": ("config.yaml", config)}).json()
        settings = [PROMPT, 0, 1, 1, "euler", 1.0, 1.0, str(tiny_model_dir)]
        assert _call(url, "generate", *settings, str(run))[0] == "complete"  # a well-formed call works
        for tuned in (str(crafted), str(Path(uploaded[0]).parent), f"{root}/../elsewhere/crafted"):
            event, data = _call(url, "generate", *settings, tuned)
            assert event == "error" and data["error"].startswith("That is not one of the offered runs")
            assert tuned not in data["error"] and "elsewhere" not in data["error"]
            assert _call(url, "run_overview", tuned) == ("complete", [None, data["error"]])
        event, data = _call(url, "generate", *settings[:-1], str(crafted / "model"), str(run))
        assert event == "error" and data["error"].startswith("That is not one of the offered base models")
        event, data = _call(url, "generate", *settings, str(evil))
        assert (
            event == "error" and "reward entry 'pwn'" in data["error"] and "--trust-run-code" in data["error"]
        )
    finally:
        demo.close()
    assert not marker.exists()


def test_the_server_answers_only_its_own_page_and_caps_request_bodies(tmp_path, tiny_model, tiny_model_dir):
    """Another site's request (by its Origin, or a DNS-rebinding page by its Host) is
    refused before Gradio queues anything, and a body over the app's cap is refused."""
    root = tmp_path / "runs"
    run = make_run(root / "run", tiny_model_dir, tiny_model)
    demo = launch(None, str(tiny_model_dir), root, port=_free_port(), block=False, allowed_hosts=["demo.lan"])
    try:
        url = demo.local_url
        port = url.rstrip("/").rsplit(":", 1)[1]
        settings = [PROMPT, 0, 1, 1, "euler", 1.0, 1.0, str(tiny_model_dir), str(run)]
        call = f"{url}gradio_api/call/generate"
        assert httpx.get(url, timeout=30).status_code == 200
        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": "null"},
            {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"},  # rebinding
        ):
            refused = httpx.post(call, json={"data": settings}, headers=headers, timeout=30)
            assert refused.status_code == 403 and "--allowed-host" in refused.text
        assert httpx.get(url, headers={"Host": f"evil.example:{port}"}, timeout=30).status_code == 403
        for host, origin in ((f"demo.lan:{port}", f"http://demo.lan:{port}"), (f"localhost:{port}", url)):
            answer = httpx.post(
                call, json={"data": settings}, headers={"Host": host, "Origin": origin}, timeout=30
            )
            assert answer.status_code == 200, (host, origin)
        too_big = httpx.post(
            f"{url}gradio_api/upload", files={"files": ("big.bin", b"\0" * (2 * 2**20))}, timeout=30
        )
        assert too_big.status_code == 413
        assert _call(url, "generate", *settings)[0] == "complete"
    finally:
        demo.close()
