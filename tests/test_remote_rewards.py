"""Remote rewards: the reference server and the client, on loopback, started and stopped inside each test."""

import socket
import threading
import time
from contextlib import contextmanager

import pytest
import torch
import uvicorn

from rewards import RewardError, build_reward, score
from rewards.remote import RemoteReward, decode_image, encode_image
from rewards.server import create_app

PROMPTS = ["a", "b", "c", "d", "e"]
META = [{"i": i} for i in range(5)]


def quantized_images(batch=5):
    """Images already on the 8-bit grid, so PNG transport is lossless."""
    return (torch.rand(batch, 3, 24, 24, generator=torch.Generator().manual_seed(0)) * 255).round() / 255


def bound_socket():
    """A loopback socket already bound to a free port (no race with other processes picking the port)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextmanager
def running_server(name, reward, sock=None):
    sock = sock or bound_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(name, reward), log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started:
        if time.time() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


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


def test_a_reward_that_fails_then_recovers_is_retried():
    calls = {"n": 0}

    def flaky(media, prompts, metadata):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise RuntimeError("GPU busy")
        return media.mean(dim=(1, 2, 3))

    media = quantized_images()
    with running_server("flaky", flaky) as url:
        with RemoteReward(url, retries=3, backoff=0.01) as client:
            scores = client(media, PROMPTS, META)
        assert calls["n"] == 3
        torch.testing.assert_close(scores["flaky"], media.mean(dim=(1, 2, 3)))
        calls["n"] = -10
        with RemoteReward(url, retries=1, backoff=0.01) as client:
            with pytest.raises(RewardError, match=r"failed 2 times; last error: HTTP 503.*GPU busy"):
                client(media, PROMPTS, META)


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
    with RemoteReward(url, retries=8, backoff=0.05) as client:
        with pytest.raises(RewardError, match="ConnectError"):
            with RemoteReward(url, retries=0) as probe:
                probe.health()
        started.set()  # the server starts while the client is backing off
        scores = client(media, PROMPTS, META)
    served.set()
    starter.join(timeout=15)
    assert torch.equal(scores["jpeg_incompressibility"], reward(media, PROMPTS, META))


def test_contract_errors_are_not_retried_and_reach_the_client():
    calls = {"n": 0}

    def nan_reward(media, prompts, metadata):
        calls["n"] += 1
        return torch.full((media.shape[0],), float("nan"))

    with (
        running_server("nan_reward", nan_reward) as url,
        RemoteReward(url, retries=3, backoff=0.01) as client,
    ):
        with pytest.raises(RewardError, match="HTTP 422.*non-finite"):
            client(quantized_images(), PROMPTS, META)
        assert calls["n"] == 1
        with pytest.raises(RewardError, match="HTTP 400.*takes image media"):
            RemoteReward(url, modality="video", retries=0)(
                quantized_images(6).view(2, 3, 3, 24, 24), PROMPTS[:2], META[:2]
            )
        with pytest.raises(RewardError, match="empty batch"):
            client(quantized_images(0), [], [])


def test_health_answers_while_a_batch_is_being_scored():
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
        with RemoteReward(url, timeout=5, retries=0) as probe:
            assert probe.health()["reward"] == "slow"  # the event loop is not blocked by scoring
        release.set()
        scorer.join(timeout=20)
    assert result["slow"].shape == (5,)


def test_a_server_that_never_answers_times_out_and_is_reported():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections, never answers
    port = listener.getsockname()[1]
    try:
        with RemoteReward(f"http://127.0.0.1:{port}", timeout=0.3, retries=2, backoff=0.01) as client:
            with pytest.raises(RewardError, match=r"failed 3 times; last error: ReadTimeout"):
                client(quantized_images(1), PROMPTS[:1], META[:1])
    finally:
        listener.close()


def test_a_server_that_is_down_is_reported():
    sock = bound_socket()  # bound, never listening
    try:
        with RemoteReward(f"http://127.0.0.1:{sock.getsockname()[1]}", retries=1, backoff=0.01) as client:
            with pytest.raises(RewardError, match="ConnectError"):
                client.health()
    finally:
        sock.close()
