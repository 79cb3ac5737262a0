"""The reward server under slow, idle and amplifying clients: header and body deadlines, the connection
cap, slots taken only once a body has arrived, the bound on bodies held, on parsed values and on decoded
media. The figures at full scale (1,500 idle connections, 8 slow bodies, peak memory) are the fault
drill's ``load`` scenario."""

import json
import socket
import threading
import time

import httpx
import pytest
from reward_server_helpers import (
    counting,
    mean_reward,
    quantized_images,
    read_answer,
    running_server,
    score_body,
)

import rewards.server
from rewards.server import Limits

HEAD = b"POST /score HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"


def connect(url):
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def closed_by_server(conn, within):
    """Whether the server closes ``conn`` (or answers and closes) within ``within`` seconds."""
    conn.settimeout(within)
    try:
        while chunk := conn.recv(4096):
            del chunk
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def answer_of(conn, seconds=10):
    """The status of the answer that arrives on ``conn`` within ``seconds``, and its body."""
    conn.settimeout(seconds)
    return read_answer(conn)


def test_a_connection_that_never_finishes_its_headers_is_closed():
    with running_server("mean", mean_reward, limits=Limits(header_timeout_s=0.5)) as url:
        silent, half = connect(url), connect(url)
        half.sendall(b"GET /hea")
        started = time.monotonic()
        assert closed_by_server(silent, within=5) and closed_by_server(half, within=5)
        assert time.monotonic() - started < 4
        # a keep-alive connection gets a new deadline for its next request's headers
        kept = connect(url)
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
        assert answer_of(kept)[0] == 200
        kept.sendall(b"GET /hea")
        assert closed_by_server(kept, within=5)


def test_at_the_connection_cap_the_oldest_idle_connection_makes_room():
    with running_server("mean", mean_reward, limits=Limits(max_connections=16)) as url:
        idle = [connect(url) for _ in range(40)]
        time.sleep(0.5)
        started = time.monotonic()
        health = httpx.get(url + "/health", timeout=5)
        assert health.status_code == 200 and time.monotonic() - started < 1
        closed = sum(closed_by_server(conn, within=0.2) for conn in idle)
        assert closed >= 40 + 1 - 16  # the oldest made room; 16 at most were ever open at once
        assert not closed_by_server(idle[-1], within=0.2)  # the newest are still open
        for conn in idle:
            conn.close()


def test_slow_bodies_hold_no_slot_and_time_out():
    limits = Limits(max_in_flight=1, body_timeout_s=1.0)
    media = quantized_images()
    with running_server("mean", counting(mean_reward), limits=limits) as url:
        slow = [connect(url) for _ in range(4)]
        for conn in slow:
            conn.sendall(HEAD % 1000 + b'{"prompts": [')
        started = time.monotonic()
        answer = httpx.post(url + "/score", json=score_body(media), timeout=10)
        assert answer.status_code == 200 and time.monotonic() - started < 1  # not 503: they hold no slot
        for conn in slow:
            status, body = answer_of(conn)
            assert status == 408 and b"body_timeout_s=1" in body
        assert time.monotonic() - started < 5


def test_bodies_held_at_once_are_bounded():
    limits = Limits(max_body_bytes=4000, max_buffered_bytes=6000)
    with running_server("mean", counting(mean_reward), limits=limits) as url:
        first, second = connect(url), connect(url)
        first.sendall(HEAD % 4000 + b"x" * 3500)
        time.sleep(0.3)
        second.sendall(HEAD % 4000 + b"y" * 3500)
        status, body = answer_of(second)
        assert status == 503 and b"max_buffered_bytes=6000" in body
        first.sendall(b"x" * 500)  # finished and answered (400: not JSON), its bytes are given back
        assert answer_of(first)[0] == 400
        media = quantized_images(1)
        assert httpx.post(url + "/score", json=score_body(media), timeout=10).status_code == 200


def test_a_body_of_many_tiny_values_is_refused_before_parsing():
    reward = counting(mean_reward)
    body = score_body(quantized_images(1))
    body["metadata"] = [{"SECRET": [{} for _ in range(60_000)]}]
    with running_server("mean", reward) as url:
        answer = httpx.post(url + "/score", content=json.dumps(body), timeout=10)
    assert answer.status_code == 413
    assert "max_json_values=50000" in answer.text and "SECRET" not in answer.text
    assert reward.calls == 0


def test_at_most_max_decoded_requests_hold_decoded_media(monkeypatch):
    entered, release = threading.Event(), threading.Event()
    holding, most = [0], [0]
    decode = rewards.server.decode_items

    def counted_decode(*arguments):
        holding[0] += 1
        most[0] = max(most[0], holding[0])
        return decode(*arguments)

    def slow(media, prompts, metadata):
        entered.set()
        release.wait(timeout=20)
        holding[0] -= 1
        return media.mean(dim=(1, 2, 3))

    monkeypatch.setattr(rewards.server, "decode_items", counted_decode)
    media, results = quantized_images(), []
    with running_server("slow", counting(slow), limits=Limits(max_decoded=2, max_in_flight=8)) as url:
        send = lambda: results.append(httpx.post(url + "/score", json=score_body(media), timeout=30))  # noqa: E731
        senders = [threading.Thread(target=send) for _ in range(5)]
        for sender in senders:
            sender.start()
        assert entered.wait(timeout=20)
        time.sleep(1.0)  # the others have arrived: one is decoded and waits, three wait to decode
        assert holding[0] == 2
        release.set()
        for sender in senders:
            sender.join(timeout=30)
    assert most[0] == 2 and [answer.status_code for answer in results] == [200] * 5


@pytest.mark.parametrize(
    "limits, message",
    [
        (dict(header_timeout_s=0), "Limits.header_timeout_s=0; allowed: a finite number of seconds > 0"),
        (dict(body_timeout_s=float("inf")), "Limits.body_timeout_s=inf; allowed: a finite number"),
        (dict(max_decoded=0), "Limits.max_decoded=0; allowed: an integer >= 1"),
        (dict(max_body_bytes=10, max_buffered_bytes=5), "max_body_bytes=10 is over max_buffered_bytes=5"),
    ],
)
def test_bad_limits_are_one_line_errors(limits, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        Limits(**limits)
