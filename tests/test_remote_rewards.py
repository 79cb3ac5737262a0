"""Remote rewards: the reference server and the client, on loopback, started and stopped inside each test.

Longer than 400 lines on purpose: every malformed, oversized or failing request the server must refuse
is reproduced here the way it was found, next to the client behaviour it drives.
"""

import base64
import io
import itertools
import json
import re
import socket
import threading
import time

import httpx
import pytest
import torch
from fastapi import FastAPI
from PIL import Image
from reward_server_helpers import (
    HUGE_PNG,
    META,
    PROMPTS,
    bound_socket,
    counting,
    mean_reward,
    png_header,
    quantized_images,
    raw_exchange,
    running_app,
    running_server,
    score_body,
)

from rewards import RewardError, build_reward, score
from rewards.remote import RemoteReward, backoff_delays, decode_image, encode_image
from rewards.server import Limits


def test_png_round_trip_is_lossless_on_8_bit_images():
    image = quantized_images(1)[0]
    assert torch.equal(decode_image(encode_image(image)), image)


def test_round_trip_matches_in_process_scores_with_batching():
    local = build_reward("jpeg_incompressibility")
    media = quantized_images()
    with running_server("jpeg_incompressibility", local) as url, RemoteReward(url, batch_size=2) as client:
        assert client.health() == {
            "status": "ok",
            "reward": "jpeg_incompressibility",
            "modality": "image",
            "protocol": 1,
        }
        remote = score("remote", client, media, PROMPTS, META)
    assert torch.equal(remote["jpeg_incompressibility"], local(media, PROMPTS, META))


def test_dict_scores_and_metadata_travel():
    def echo(media, prompts, metadata):
        return {"index": torch.tensor([float(m["i"]) for m in metadata]), "mean": media.mean(dim=(1, 2, 3))}

    media = quantized_images()
    with running_server("echo", echo) as url, RemoteReward(url, batch_size=3) as client:
        scores = client(media, PROMPTS, META)
    assert scores["index"].tolist() == [0, 1, 2, 3, 4]
    torch.testing.assert_close(scores["mean"], media.mean(dim=(1, 2, 3)))


def test_video_rewards_are_served():
    videos = quantized_images(6).view(2, 3, 3, 24, 24)
    reward = build_reward("temporal_consistency")
    with running_server("temporal_consistency", reward) as url, RemoteReward(url, modality="video") as client:
        scores = client(videos, PROMPTS[:2], META[:2])
    torch.testing.assert_close(scores["temporal_consistency"], reward(videos, PROMPTS[:2], META[:2]))


@pytest.mark.parametrize(
    "error",
    [
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("out of memory"),
    ],
)
def test_a_reward_out_of_memory_is_a_503_retried_until_it_recovers(error):
    calls = {"n": 0}

    def flaky(media, prompts, metadata):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise error
        return media.mean(dim=(1, 2, 3))

    media = quantized_images()
    with running_server("flaky", flaky) as url:
        with RemoteReward(url, patience=20, backoff=0.01) as client:
            scores = client(media, PROMPTS, META)
        assert calls["n"] == 3
        torch.testing.assert_close(scores["flaky"], media.mean(dim=(1, 2, 3)))
        calls["n"] = -1000
        with RemoteReward(url, patience=0.2, backoff=0.01) as client:
            with pytest.raises(
                RewardError, match=r"did not answer POST /score: \d+ attempts.*HTTP 503.*out of memory"
            ):
                client(media, PROMPTS, META)


def test_a_reward_that_raises_is_a_500_and_not_retried():
    def broken(media, prompts, metadata):
        raise ValueError("no such key 'color'")

    reward = counting(broken)
    with running_server("broken", reward) as url, RemoteReward(url, patience=30, backoff=0.01) as client:
        with pytest.raises(
            RewardError, match=r"HTTP 500.*reward 'broken' raised ValueError: no such key 'color'"
        ):
            client(quantized_images(), PROMPTS, META)
    assert reward.calls == 1


def test_a_server_that_comes_up_late_is_retried_until_it_answers():
    sock = bound_socket()  # bound but not listening: connections are refused
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    reward = build_reward("jpeg_incompressibility")
    started = threading.Event()

    def start_later():
        started.wait(timeout=10)
        with running_server("jpeg_incompressibility", reward, sock):
            served.wait(timeout=30)

    served = threading.Event()
    starter = threading.Thread(target=start_later, daemon=True)
    starter.start()
    media = quantized_images()
    with RemoteReward(url, patience=20, backoff=0.05, startup_patience=None) as client:
        with pytest.raises(RewardError, match="ConnectError"):
            RemoteReward(url, startup_patience=0)
        started.set()  # the server starts while the client is backing off
        scores = client(media, PROMPTS, META)
    served.set()
    starter.join(timeout=15)
    assert torch.equal(scores["jpeg_incompressibility"], reward(media, PROMPTS, META))


def test_the_client_outlasts_a_server_restart():
    sock = bound_socket()
    port = sock.getsockname()[1]
    first, second = counting(mean_reward), counting(mean_reward)
    media = quantized_images()
    restarted, done = threading.Event(), threading.Event()
    with running_server("mean", first, sock) as url:
        client = RemoteReward(url, patience=20, backoff=0.1, max_backoff=1.0)
        before = client(media, PROMPTS, META)

    def restart():  # the server is down now; it comes back on the same port 2 s later
        time.sleep(2)
        with running_server("mean", second, bound_socket(port)):
            restarted.set()
            done.wait(timeout=30)

    restarter = threading.Thread(target=restart, daemon=True)
    restarter.start()
    try:
        with client:
            after = client(media, PROMPTS, META)
    finally:
        done.set()
        restarter.join(timeout=15)
    assert restarted.is_set() and (first.calls, second.calls) == (1, 1)
    assert torch.equal(before["mean"], after["mean"])


def test_contract_errors_are_not_retried_and_reach_the_client():
    calls = {"n": 0}

    def nan_reward(media, prompts, metadata):
        calls["n"] += 1
        return torch.full((media.shape[0],), float("nan"))

    with (
        running_server("nan_reward", nan_reward) as url,
        RemoteReward(url, patience=30, backoff=0.01) as client,
    ):
        with pytest.raises(RewardError, match="HTTP 422.*non-finite"):
            client(quantized_images(), PROMPTS, META)
        assert calls["n"] == 1
        with RemoteReward(url, modality="video", startup_patience=None) as video_client:
            with pytest.raises(RewardError, match="HTTP 400.*takes image media"):
                video_client(quantized_images(6).view(2, 3, 3, 24, 24), PROMPTS[:2], META[:2])
        with pytest.raises(RewardError, match="empty batch"):
            client(quantized_images(0), [], [])


def test_health_and_refusals_answer_while_a_batch_is_being_scored():
    entered, release = threading.Event(), threading.Event()

    def slow(media, prompts, metadata):
        entered.set()
        release.wait(timeout=20)
        return media.mean(dim=(1, 2, 3))

    result = {}
    with running_server("slow", slow) as url, RemoteReward(url, timeout=30) as client:
        scorer = threading.Thread(target=lambda: result.update(client(quantized_images(), PROMPTS, META)))
        scorer.start()
        assert entered.wait(timeout=20)
        with RemoteReward(url, timeout=5, patience=0) as probe:
            assert probe.health()["reward"] == "slow"  # the event loop is not blocked by scoring
        # checking a request does not wait for the scoring lock, which the slow reward holds
        refused = httpx.post(url + "/score", json={"prompts": ["a"], "images": [HUGE_PNG]}, timeout=5)
        assert refused.status_code == 413
        release.set()
        scorer.join(timeout=20)
    assert result["slow"].shape == (5,)


def test_a_busy_server_answers_503_and_the_client_retries():
    entered, release = threading.Event(), threading.Event()

    def slow(media, prompts, metadata):
        entered.set()
        release.wait(timeout=20)
        return media.mean(dim=(1, 2, 3))

    reward = counting(slow)
    results = []
    media = quantized_images()
    with running_server("slow", reward, limits=Limits(max_in_flight=1)) as url:
        clients = [
            RemoteReward(url, timeout=30, patience=20, backoff=0.05, max_backoff=0.2) for _ in range(2)
        ]
        scorers = [
            threading.Thread(target=lambda c=c: results.append(c(media, PROMPTS, META))) for c in clients
        ]
        scorers[0].start()
        assert entered.wait(timeout=20)
        busy = httpx.post(url + "/score", json=score_body(media), timeout=5)
        assert busy.status_code == 503
        assert busy.json() == {"error": "busy: max_in_flight=1 requests in progress; retry later"}
        scorers[1].start()  # refused while the first is scored, it retries until a slot is free
        time.sleep(0.3)
        release.set()
        for scorer in scorers:
            scorer.join(timeout=30)
        for client in clients:
            client.close()
    assert reward.calls == 2 and len(results) == 2


def test_a_server_that_never_answers_times_out_and_is_reported():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections, never answers
    port = listener.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    try:
        with RemoteReward(url, timeout=0.3, patience=0.5, backoff=0.01, startup_patience=None) as client:
            with pytest.raises(RewardError, match=r"did not answer POST /score: \d+ attempts.*ReadTimeout"):
                client(quantized_images(1), PROMPTS[:1], META[:1])
    finally:
        listener.close()


def test_a_dead_url_fails_the_start_up_health_check_quickly():
    sock = bound_socket()  # bound, never listening
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    started = time.monotonic()
    try:
        with pytest.raises(
            RewardError,
            match=rf"^reward server {url} did not answer GET /health: \d+ attempts in [\d.]+ s "
            r"\(patience 0.5 s\); last error: ConnectError",
        ):
            RemoteReward(url, startup_patience=0.5, backoff=0.1)
    finally:
        sock.close()
    assert time.monotonic() - started < 10  # sanity: the start-up patience, not the 300 s of scoring


def test_the_start_up_health_check_refuses_another_modality_or_protocol():
    with running_server("mean", mean_reward) as url:
        with pytest.raises(
            RewardError, match="serves 'mean' on 'image' media; this client has modality='video'"
        ):
            RemoteReward(url, modality="video")
    other = FastAPI()

    @other.get("/health")
    def health():
        return {"status": "ok", "reward": "mean", "modality": "image", "protocol": 2}

    with running_app(other) as url:
        with pytest.raises(RewardError, match="speaks protocol 2; this client speaks 1"):
            RemoteReward(url)
    with running_app(FastAPI()) as url:
        with pytest.raises(RewardError, match="refused the request: HTTP 404"):
            RemoteReward(url)


def test_an_oversized_body_is_refused_before_it_is_read():
    reward = counting(mean_reward)
    head = b"POST /score HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
    start = b'{"prompts": ["SECRET'
    with running_server("mean", reward, limits=Limits(max_body_bytes=1000)) as url:
        # 150 MB announced, 20 bytes sent: the answer cannot have waited for the body
        status, body = raw_exchange(url, head + b"Content-Length: 150000000\r\n\r\n" + start)
        assert status == 413 and b"max_body_bytes=1000" in body and b"SECRET" not in body
        # no length announced: refused once 1000 bytes have arrived, the body still unfinished
        part = start + b"x" * 2000
        status, body = raw_exchange(
            url, head + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(part), part)
        )
        assert status == 413 and b"max_body_bytes=1000" in body and b"SECRET" not in body
        started = time.monotonic()
        with RemoteReward(url, patience=60) as client:
            with pytest.raises(RewardError, match=r"HTTP 413.*max_body_bytes=1000"):
                client(quantized_images(), PROMPTS, META)
        assert time.monotonic() - started < 30  # sanity: refused at once, not retried for the patience
    assert reward.calls == 0


@pytest.mark.parametrize(
    "side, message",
    [
        (8000, "images[0] is 8000x8000 pixels; this server's max_pixels=4194304"),
        (30000, "images[0] is over this server's max_pixels=4194304: Image size (900000000 pixels) exceeds"),
    ],
)
def test_a_png_with_too_many_pixels_is_refused_before_decoding(side, message):
    reward = counting(mean_reward)
    huge = base64.b64encode(png_header(side, side)).decode("ascii")
    with running_server("mean", reward) as url:
        answer = httpx.post(url + "/score", json={"prompts": ["a"], "images": [huge]}, timeout=30)
    # decoding would have failed (the PNG holds 64 bytes of pixels): 413 means only the header was read
    assert answer.status_code == 413 and answer.json()["error"].startswith(message)
    assert reward.calls == 0


@pytest.mark.parametrize(
    "limits, modality, message",
    [
        (Limits(max_items=4), "image", "5 items; this server's max_items=4"),
        (Limits(max_frames=2), "video", "3 frames per video; this server's max_frames=2"),
        (Limits(max_pixels=500), "image", "images[0] is 24x24 pixels; this server's max_pixels=500"),
        (Limits(max_pixels=500), "video", "videos[0][0] is 24x24 pixels; this server's max_pixels=500"),
        (Limits(max_total_pixels=2000), "image", "2880 pixels in all; this server's max_total_pixels=2000"),
    ],
)
def test_batches_over_the_limits_are_refused(limits, modality, message):
    reward = counting(mean_reward, modality)
    media = quantized_images() if modality == "image" else quantized_images(6).view(2, 3, 3, 24, 24)
    with running_server("mean", reward, limits=limits) as url, RemoteReward(url, modality=modality) as client:
        with pytest.raises(RewardError, match=r"HTTP 413: .*" + re.escape(message)):
            client(media, PROMPTS[: media.shape[0]], META[: media.shape[0]])
    assert reward.calls == 0


def jpeg_b64():
    buffer = io.BytesIO()
    Image.new("RGB", (24, 24)).save(buffer, format="JPEG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"metadata": [1, 2, 3, 4, 5]}, "bad request: metadata.0: Input should be an object"),
        ({"metadata": META[:4]}, "5 media, 5 prompts and 4 metadata entries"),
        ({"prompts": [1, "b", "c", "d", "e"]}, "bad request: prompts.0: Input should be a valid string"),
        ({"videos": [["a"]] * 5}, "bad request: needs exactly one of 'images' or 'videos'"),
        ({"images": ["not a png"] * 5}, "images[0] is not a base64 PNG: Error"),
        ({"images": [jpeg_b64()] * 5}, "images[0] is not a base64 PNG: UnidentifiedImageError"),
        (
            {"images": [encode_image(torch.zeros(3, 8, 8))] * 4 + [encode_image(torch.zeros(3, 8, 9))]},
            "media need one size",
        ),
    ],
)
def test_malformed_requests_are_400_and_the_reward_is_not_called(change, message):
    reward = counting(mean_reward)
    with running_server("mean", reward) as url:
        answer = httpx.post(url + "/score", json={**score_body(quantized_images()), **change}, timeout=30)
    assert answer.status_code == 400 and answer.json()["error"].startswith(message)
    assert reward.calls == 0


def test_error_answers_never_echo_the_request():
    filler = "x" * (20 * 2**20)
    bodies = [
        '{"prompts": ["' + filler,  # invalid JSON
        json.dumps({"prompts": [{"text": filler}], "images": ["a"]}),  # a prompt that is not a string
        json.dumps({"prompts": ["a"], "metadata": [filler], "images": ["a"]}),  # metadata not an object
        json.dumps({"prompts": ["a"], "images": [filler]}),  # not a PNG
    ]
    reward = counting(mean_reward)
    with running_server("mean", reward) as url:
        for body in bodies:
            answer = httpx.post(url + "/score", content=body, timeout=60)
            assert answer.status_code == 400
            assert len(answer.content) < 600 and "xxxxxxxxxx" not in answer.text
    assert reward.calls == 0


def test_api_docs_are_off_unless_asked_for():
    paths = ("/docs", "/redoc", "/openapi.json")
    with running_server("mean", mean_reward) as url:
        assert [httpx.get(url + path).status_code for path in paths] == [404, 404, 404]
    with running_server("mean", mean_reward, docs=True) as url:
        assert [httpx.get(url + path).status_code for path in paths] == [200, 200, 200]
        assert "prompts" in json.dumps(httpx.get(url + "/openapi.json").json()["paths"]["/score"])


def test_backoff_doubles_up_to_its_cap():
    assert list(itertools.islice(backoff_delays(0.5, 10.0), 7)) == [0.5, 1, 2, 4, 8, 10, 10]


def test_bad_settings_are_one_line_errors():
    with pytest.raises(ValueError, match=r"^RemoteReward patience=-1; allowed: seconds >= 0$"):
        RemoteReward("http://127.0.0.1:1", patience=-1)
    with pytest.raises(ValueError, match=r"^RemoteReward startup_patience=-2"):
        RemoteReward("http://127.0.0.1:1", startup_patience=-2)
    with pytest.raises(ValueError, match=r"^Limits.max_items=0; allowed: an integer >= 1$"):
        Limits(max_items=0)


@pytest.mark.parametrize(
    "metadata, message",
    [
        ({"include": "a red circle SECRET"}, r"metadata\[0\] needs an 'include' list"),
        ({"include": [{"class": "SECRET"}]}, r"metadata\[0\].include\[0\] needs a 'class'"),
        ({"include": [{"class": "circle", "count": 10**9}]}, r"'count' must be an integer in \[1, 64\]"),
        ({"include": [{"class": "circle", "position": ["SECRET", 3]}]}, r"'position' must be \[relation"),
        ("SECRET", r"metadata.0: Input should be an object"),
    ],
)
def test_malformed_verifier_metadata_is_a_client_error_that_echoes_nothing(metadata, message):
    """4xx (final, the request's fault), not 500, and nothing of the input in the answer."""
    reward = build_reward("shapes_verifier")
    images = quantized_images()
    with running_server("shapes_verifier", reward) as url:
        answer = httpx.post(
            f"{url}/score",
            json={
                "prompts": ["a red circle"] * images.shape[0],
                "metadata": [metadata] * images.shape[0],
                "images": [encode_image(image) for image in images],
            },
            timeout=30,
        )
    assert answer.status_code in (400, 422), answer.text  # 400: the protocol's schema; 422: the verifier
    assert re.search(message, answer.json()["error"]) and "SECRET" not in answer.text
