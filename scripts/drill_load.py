"""The fault drill's ``load`` scenario: ``flowrl reward-server`` (default limits, the ``brightness`` reward,
so that the reward's own memory is nil) under clients that stall or amplify, in a process of its own whose
resident memory is read from ``/proc``:

  idle + slow   1,500 connections that never finish their headers and 8 bodies trickled a byte at a time:
                ``/health`` must answer within 1 s throughout and a good request must be scored; the idle
                connections are closed (cap, then header deadline) and the slow bodies answered 408
  metadata      one 63 MiB body of tiny metadata values: 413 before parsing
  decode        8 requests at once of 8 x 2048^2 PNGs each (the largest the limits allow)
  bodies        8 bodies at once of 3 noise PNGs of 2048^2 (50 MB each): some 503 (bodies held), retried

For each amplification case the server's peak resident memory above its idle level is compared with
``rewards.server_limits.memory_bound(Limits())``.
"""

from __future__ import annotations

import base64
import io
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rewards.server_limits import Limits, memory_bound  # noqa: E402

IDLE_CONNECTIONS, SLOW_BODIES = 1500, 8
Result = tuple[str, str, bool]  # fault, behaviour, ok


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int, reward: str = "brightness") -> subprocess.Popen:
    """``flowrl reward-server --reward <reward>`` on ``port``, once ``/health`` answers."""
    process = subprocess.Popen(
        [sys.executable, "-m", "flowrl.cli", "reward-server", "--reward", reward, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.3)
    process.kill()
    raise RuntimeError("the reward server did not come up")


def resident_mib(pid: int, field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last reset) of ``pid``, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for process {pid}")


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def png(side: int, noise: bool) -> str:
    rng = np.random.default_rng(0)
    pixels = (
        rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
        if noise
        else np.full((side, side, 3), 90, np.uint8)
    )
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def timed_health(url: str) -> float:
    started = time.monotonic()
    try:
        ok = httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.TransportError:
        ok = False
    return time.monotonic() - started if ok else float("inf")


def slow_body(port: int, answers: list[int], stop: threading.Event) -> None:
    """Headers for a 10 MB body, then a byte every half second until answered or stopped."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as conn:
        conn.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        conn.sendall(b"Content-Length: 10000000\r\n\r\n{")
        conn.settimeout(0.5)
        while not stop.is_set():
            try:
                answer = conn.recv(4096)
                answers.append(int(answer.split()[1]) if answer else 0)
                return
            except TimeoutError:
                try:
                    conn.sendall(b" ")
                except OSError:
                    answers.append(0)
                    return


def idle_and_slow(port: int, url: str) -> Result:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, IDLE_CONNECTIONS + 1024), hard))
    idle = []
    for _ in range(IDLE_CONNECTIONS):
        idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        idle[-1].sendall(b"GET /hea")
    answers: list[int] = []
    stop = threading.Event()
    trickles = [threading.Thread(target=slow_body, args=(port, answers, stop)) for _ in range(SLOW_BODIES)]
    for trickle in trickles:
        trickle.start()
    latencies = []
    started = time.monotonic()
    good = httpx.post(url + "/score", json=request_of([png(64, False)] * 4), timeout=30).status_code
    while time.monotonic() - started < 12:  # past the header deadline (10 s)
        latencies.append(timed_health(url))
        time.sleep(0.25)
    closed = sum(was_closed(conn) for conn in idle)
    for conn in idle:
        conn.close()
    for trickle in trickles:
        trickle.join(timeout=70)  # the body deadline is 60 s
    stop.set()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    worst = max(latencies)
    ok = worst < 1 and good == 200 and closed == IDLE_CONNECTIONS and answers == [408] * SLOW_BODIES
    return (
        f"{IDLE_CONNECTIONS} connections that never finish their headers + {SLOW_BODIES} slow bodies",
        f"/health answered {len(latencies)} times, slowest {worst * 1000:.0f} ms; a good request scored "
        f"({good}); {closed}/{IDLE_CONNECTIONS} idle connections closed by the server within 12 s; "
        f"slow bodies answered {sorted(set(answers))}",
        ok,
    )


def was_closed(conn: socket.socket) -> bool:
    conn.settimeout(0.01)
    try:
        return conn.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def request_of(images: list[str], metadata: list | None = None) -> dict:
    return {"prompts": ["p"] * len(images), "images": images, **({"metadata": metadata} if metadata else {})}


def peak_under(pid: int, send: Callable[[], list[int]]) -> tuple[list[int], float]:
    """The statuses ``send`` got, and the server's peak resident MiB above its level before."""
    idle = resident_mib(pid, "VmRSS")
    reset_peak(pid)
    statuses = send()
    return statuses, resident_mib(pid, "VmHWM") - idle


def concurrently(url: str, bodies: list[bytes], patience: float = 120) -> list[int]:
    """POST every body at once; a 503 is retried (as the client does) until ``patience`` runs out."""
    statuses = [0] * len(bodies)

    def post(index: int) -> None:
        deadline = time.monotonic() + patience
        while True:
            answer = httpx.post(url + "/score", content=bodies[index], timeout=120)
            statuses[index] = answer.status_code
            if answer.status_code != 503 or time.monotonic() > deadline:
                return
            time.sleep(0.5)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses


def amplification(pid: int, url: str) -> list[Result]:
    bound = memory_bound(Limits()) / 2**20
    tiny = json.dumps(request_of([png(64, False)], [{"v": [{}] * (63 * 2**20 // 4)}])).encode()
    decode = json.dumps(request_of([png(2048, False)] * 8)).encode()
    noise = json.dumps(request_of([png(2048, True)] * 3)).encode()
    cases = [
        (f"one {len(tiny) / 2**20:.0f} MiB body of tiny metadata values", lambda: concurrently(url, [tiny])),
        ("8 requests at once of 8 PNGs of 2048^2", lambda: concurrently(url, [decode] * 8)),
        (
            f"8 bodies at once of {len(noise) / 1e6:.0f} MB (3 noise PNGs of 2048^2)",
            lambda: concurrently(url, [noise] * 8),
        ),
    ]
    results = []
    for fault, send in cases:
        statuses, peak = peak_under(pid, send)
        expected = {413} if "metadata" in fault else {200}
        results.append(
            (
                fault,
                f"answered {sorted(statuses)}; peak resident memory +{peak:.0f} MiB "
                f"(bound {bound:.0f} MiB, rewards.server_limits.memory_bound)",
                set(statuses) == expected and peak <= bound,
            )
        )
    return results


def load_scenario() -> list[Result]:
    port = free_port()
    server = start_server(port)
    url = f"http://127.0.0.1:{port}"
    try:
        httpx.post(url + "/score", json=request_of([png(64, False)]), timeout=30)  # warm
        results = [idle_and_slow(port, url), *amplification(server.pid, url)]
        healthy = timed_health(url) < 1
    finally:
        server.kill()
        server.wait()
    return [
        (fault, behaviour + ("" if healthy else "; server then UNHEALTHY"), ok and healthy)
        for fault, behaviour, ok in results
    ]


if __name__ == "__main__":
    for fault, behaviour, ok in load_scenario():
        print(f"{'ok ' if ok else 'NO '} {fault}: {behaviour}", flush=True)
    os._exit(0)
