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


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(name, reward):
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(name, reward), host="127.0.0.1", port=port, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
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


def test_png_round_trip_is_lossless_on_8_bit_images():
    image = quantized_images(1)[0]
    assert torch.equal(decode_image(encode_image(image)), image)


def test_round_trip_matches_in_process_scores_with_batching():
    local = build_reward("jpeg_incompressibility")
    media = quantized_images()
    with running_server("jpeg_incompressibility", local) as url:
        client = RemoteReward(url, batch_size=2)
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
    with running_server("echo", echo) as url:
        scores = RemoteReward(url, batch_size=3)(media, PROMPTS, META)
    assert scores["index"].tolist() == [0, 1, 2, 3, 4]
    torch.testing.assert_close(scores["mean"], media.mean(dim=(1, 2, 3)))


def test_video_rewards_are_served():
    videos = quantized_images(6).view(2, 3, 3, 24, 24)
    reward = build_reward("temporal_consistency")
    with running_server("temporal_consistency", reward) as url:
        scores = RemoteReward(url, modality="video")(videos, PROMPTS[:2], META[:2])
    torch.testing.assert_close(scores["temporal_consistency"], reward(videos, PROMPTS[:2], META[:2]))


def test_a_failing_then_recovering_server_is_retried():
    calls = {"n": 0}

    def flaky(media, prompts, metadata):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise RuntimeError("GPU busy")
        return media.mean(dim=(1, 2, 3))

    media = quantized_images()
    with running_server("flaky", flaky) as url:
        scores = RemoteReward(url, retries=3, backoff=0.01)(media, PROMPTS, META)
        assert calls["n"] == 3
        torch.testing.assert_close(scores["flaky"], media.mean(dim=(1, 2, 3)))
        calls["n"] = -10
        with pytest.raises(RewardError, match=r"failed 2 times; last error: HTTP 500.*GPU busy"):
            RemoteReward(url, retries=1, backoff=0.01)(media, PROMPTS, META)


def test_server_side_boundary_errors_reach_the_client():
    def nan_reward(media, prompts, metadata):
        return torch.full((media.shape[0],), float("nan"))

    with running_server("nan_reward", nan_reward) as url:
        with pytest.raises(RewardError, match="non-finite"):
            RemoteReward(url, retries=0)(quantized_images(), PROMPTS, META)
        with pytest.raises(RewardError, match="HTTP 400.*takes image media"):
            RemoteReward(url, modality="video", retries=0)(
                quantized_images(6).view(2, 3, 3, 24, 24), PROMPTS[:2], META[:2]
            )


def test_a_server_that_never_answers_times_out_and_is_reported():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections, never answers
    port = listener.getsockname()[1]
    try:
        client = RemoteReward(f"http://127.0.0.1:{port}", timeout=0.3, retries=2, backoff=0.01)
        start = time.perf_counter()
        with pytest.raises(RewardError, match=r"failed 3 times; last error: ReadTimeout"):
            client(quantized_images(1), PROMPTS[:1], META[:1])
        assert time.perf_counter() - start < 5
    finally:
        listener.close()


def test_a_server_that_is_down_is_reported():
    client = RemoteReward(f"http://127.0.0.1:{free_port()}", retries=1, backoff=0.01)
    with pytest.raises(RewardError, match="ConnectError"):
        client.health()
