"""What the reward-server tests share: a server on loopback for the duration of a block, raw exchanges,
request bodies and rewards that count their calls."""

import base64
import socket
import struct
import threading
import time
import zlib
from contextlib import contextmanager

import torch
import uvicorn

from rewards.remote import encode_media
from rewards.server import Limits, create_app
from rewards.server_protocol import server_config

PROMPTS = ["a", "b", "c", "d", "e"]
META = [{"i": i} for i in range(5)]


def quantized_images(batch=5):
    """Images already on the 8-bit grid, so PNG transport is lossless."""
    return (torch.rand(batch, 3, 24, 24, generator=torch.Generator().manual_seed(0)) * 255).round() / 255


def bound_socket(port=0):
    """A loopback socket already bound to a free port (no race with other processes picking the port)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def counting(reward, modality="image"):
    """``reward`` that also counts its calls in ``.calls``."""

    def counted(media, prompts, metadata):
        counted.calls += 1
        return reward(media, prompts, metadata)

    counted.calls, counted.modality = 0, modality
    return counted


def mean_reward(media, prompts, metadata):
    return media.mean(dim=tuple(range(1, media.ndim)))


def score_body(images):
    """A valid ``/score`` request body for a batch of images."""
    return {
        "prompts": PROMPTS[: len(images)],
        "metadata": META[: len(images)],
        **encode_media(images, "image"),
    }


@contextmanager
def running_server(name, reward, sock=None, **options):
    """``create_app(name, reward, **options)`` served on loopback for the duration of the block, with
    the server's guarded protocol (header deadline, connection cap) as ``flowrl reward-server`` runs it."""
    app = create_app(name, reward, **options)
    with running_app(app, sock, options.get("limits") or Limits()) as url:
        yield url


@contextmanager
def running_app(app, sock=None, limits=None):
    """``app`` served by uvicorn on loopback (on ``sock`` if given) for the duration of the block; with
    ``limits``, through ``rewards.server_protocol.server_config`` as the reward server serves."""
    sock = sock or bound_socket()
    port = sock.getsockname()[1]
    config = (
        server_config(app, limits, log_level="error") if limits else uvicorn.Config(app, log_level="error")
    )
    server = uvicorn.Server(config)
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


def png_header(width, height):
    """A PNG that declares ``width x height`` RGB pixels but holds almost none (decoding it fails)."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


HUGE_PNG = base64.b64encode(png_header(8000, 8000)).decode("ascii")


def raw_exchange(url, request):
    """Send raw request bytes (perhaps only the start of the body), then read the answer: (status, body)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request)
        return read_answer(conn)


def read_answer(conn):
    """The answer that arrives on ``conn``: (status, body)."""
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < content_length(answer):
        chunk = conn.recv(65536)
        assert chunk, f"connection closed after {answer!r}"
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def content_length(answer):
    """The Content-Length of an answer whose head has arrived (0 until then)."""
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0
