"""Benchmark the built-in rewards on their tiny random-weight architectures, and the remote protocol's overhead.

Prints a table and writes JSON: images per second of each built-in in process,
and for two rewards the round trip through ``flowrl reward-server``'s app on
loopback against in-process scoring (the protocol's overhead as a ratio).

    python scripts/bench_rewards.py --out outputs/bench_rewards.json
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
import uvicorn

from flowrl.shapes.grammar import shipped_prompts
from flowrl.shapes.render import render_prompt
from rewards import build_reward, score
from rewards.remote import RemoteReward
from rewards.server import create_app
from rewards.testing import (
    TINY_CLIP,
    offline_clip_tokenizer,
    tiny_aesthetic_head,
    tiny_open_clip_checkpoint,
    tiny_pickscore_model,
)


def timed(repeats: int, function, *call_args) -> float:
    """Median seconds of ``function(*call_args)`` over ``repeats`` runs after one warm-up."""
    function(*call_args)
    durations = []
    for _ in range(repeats):
        start = time.perf_counter()
        function(*call_args)
        durations.append(time.perf_counter() - start)
    return statistics.median(durations)


def start_server(name, reward):
    """Serve ``reward`` on a loopback socket bound before the server starts (no port race)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(name, reward), log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread, sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=64, help="image side for the generic rewards")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="outputs/bench_rewards.json")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="flowrl-bench-rewards-"))
    clip = tiny_open_clip_checkpoint(work / "clip.pt")
    records = (shipped_prompts("test") * args.batch)[: args.batch]
    rng = np.random.default_rng(0)
    shapes = torch.from_numpy(np.stack([render_prompt(r, rng) for r in records])).permute(0, 3, 1, 2)
    shape_prompts = [r["prompt"] for r in records]
    images = (
        torch.rand(args.batch, 3, args.size, args.size, generator=torch.Generator().manual_seed(0)) * 255
    ).round() / 255
    videos = images[: args.batch // 4 * 4].view(-1, 4, 3, args.size, args.size)
    prompts = ["a photo of a red circle"] * args.batch
    metadata = [{"text": "flowrl"}] * args.batch

    cases = {
        "shapes_verifier": (build_reward("shapes_verifier"), shapes, shape_prompts, records),
        "jpeg_compressibility": (build_reward("jpeg_compressibility"), images, prompts, metadata),
        "clip_score (tiny)": (
            build_reward("clip_score", model_name=TINY_CLIP, checkpoint=clip),
            images,
            prompts,
            metadata,
        ),
        "hpsv2 (tiny)": (
            build_reward(
                "hpsv2", model_name=TINY_CLIP, checkpoint=tiny_open_clip_checkpoint(work / "hps.pt", True)
            ),
            images,
            prompts,
            metadata,
        ),
        "aesthetic (tiny)": (
            build_reward(
                "aesthetic",
                model_name=TINY_CLIP,
                clip_checkpoint=clip,
                head_checkpoint=tiny_aesthetic_head(work / "head.pth"),
            ),
            images,
            prompts,
            metadata,
        ),
        "pickscore (tiny)": (
            build_reward(
                "pickscore",
                model_path=tiny_pickscore_model(work / "pick"),
                tokenizer_path=offline_clip_tokenizer(work / "tok"),
            ),
            images,
            prompts,
            metadata,
        ),
        "frame_average(jpeg), 4 frames": (
            build_reward("frame_average", reward="jpeg_compressibility"),
            videos,
            prompts[: len(videos)],
            metadata[: len(videos)],
        ),
        "temporal_consistency (pixels)": (
            build_reward("temporal_consistency"),
            videos,
            prompts[: len(videos)],
            metadata[: len(videos)],
        ),
    }
    try:
        cases["ocr (real PP-OCRv4)"] = (build_reward("ocr"), images, prompts, metadata)
    except ImportError:
        print("ocr: skipped (install the 'ocr' extra)")

    rows = []
    for name, (reward, media, case_prompts, case_metadata) in cases.items():
        seconds = timed(args.repeats, score, name, reward, media, case_prompts, case_metadata)
        items = media.shape[0] * (media.shape[1] if media.ndim == 5 else 1)
        rows.append(
            {
                "reward": name,
                "items": media.shape[0],
                "images": items,
                "seconds": seconds,
                "images_per_second": items / seconds,
            }
        )

    remote_rows = []
    for name in ("jpeg_compressibility", "clip_score (tiny)"):
        reward, media, case_prompts, case_metadata = cases[name]
        server, thread, sock, url = start_server(name, reward)
        with RemoteReward(url, batch_size=args.batch) as client:
            local = timed(args.repeats, score, name, reward, media, case_prompts, case_metadata)
            remote = timed(args.repeats, score, "remote", client, media, case_prompts, case_metadata)
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        remote_rows.append(
            {
                "reward": name,
                "in_process_seconds": local,
                "remote_seconds": remote,
                "remote_over_in_process": remote / local,
            }
        )

    print(f"{'reward':<32}{'images/s':>10}{'s/batch':>9}")
    for row in rows:
        print(f"{row['reward']:<32}{row['images_per_second']:>10.1f}{row['seconds']:>9.3f}")
    print(f"\n{'remote round trip':<32}{'in-process s':>13}{'remote s':>10}{'ratio':>7}")
    for row in remote_rows:
        print(
            f"{row['reward']:<32}{row['in_process_seconds']:>13.3f}{row['remote_seconds']:>10.3f}{row['remote_over_in_process']:>7.2f}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "batch": args.batch,
                "size": args.size,
                "threads": torch.get_num_threads(),
                "rewards": rows,
                "remote": remote_rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
