"""Fault drill: a short shapes-world training (the shipped base model, DiffusionNFT) run through the faults a
long run meets, each end to end in real processes, with a table of what happened.

    python scripts/fault_drill.py                    # every scenario (about 5 minutes on 2 CPU cores)
    python scripts/fault_drill.py --only kill corrupt

Scenarios (the training ones compared with one uninterrupted reference run of the same config):
  kill       ``kill -9`` at random moments (several trials); ``resume=latest`` until the run completes;
             the final weights and every step's reward must equal the reference's bit for bit
  sigint     Ctrl-C: exit status 130 with a resume hint; resuming completes identically
  corrupt    the newest checkpoint flipped, truncated, emptied (0-byte file) or with an empty manifest:
             ``resume=latest`` falls back to the previous one and completes identically
  unusable   every checkpoint corrupted: ``resume=latest`` is a one-line error; metrics.jsonl is untouched
  disk_full  the run folder on a small tmpfs (needs root): the checkpoint write fails, leaves no temporary
             folder; with space freed, ``resume=latest`` completes identically
  server     the reward served by ``flowrl reward-server``; the server is killed mid-run and restarted
             seconds later: the client retries and the run completes
  nan        a reward that returns NaN on some batches: ``on_error: raise`` stops with one line;
             ``skip_batch`` and ``zero`` complete, counting what they absorbed
  configs    bad config files, overrides and prompt files through ``flowrl train`` (in process), alias
             bombs and deep YAML included: each must be refused with exit status 2 and one line naming
             what was wrong, before any model loads or any run file is written
  requests   malformed and oversized requests to ``flowrl reward-server``: each must be a quick 4xx that
             does not echo its input, and the server must stay healthy
  load       ``flowrl reward-server`` under 1,500 idle connections and 8 slow bodies (``/health`` within
             1 s), and amplifying requests (peak memory within the documented bound): ``drill_load.py``
  demo       the demo app over a runs folder holding symlinks out, an outside ``model.name``, a ``remote``
             reward (SSRF), an alias bomb, a huge architecture and broken folders: ``drill_demo.py``
  folder     two runs started into one folder at once: one trains (identically to the reference), the
             other is refused in one line; ``resume=latest`` into a live run is refused and the live run
             completes identically

Writes ``--out`` (JSON) beside the printed table. Run it alone: it times nothing, but its processes
need the CPU.

Longer than 400 lines on purpose: one function per scenario, with the bad inputs listed in full, read
top to bottom like the table it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from drill_demo import demo_scenario  # noqa: E402
from drill_load import free_port, load_scenario, start_server  # noqa: E402

from flowrl.checkpoint import list_checkpoints, read_checkpoint  # noqa: E402
from flowrl.run_folder import RUN_FILES  # noqa: E402
from flowrl.run_log import read_metrics  # noqa: E402

STEPS = 8
#: a short run of the main job's recipe: small batches, few sampler steps, a quick evaluation
DRILL_RUN = [
    "training.prompts_per_step=2",
    "training.group_size=4",
    "training.micro_batch_size=8",
    "training.updates_per_step=2",
    "training.threads=1",
    "sampler.num_steps=4",
    "evaluation.every=0",
    "evaluation.images_per_task=2",
    "evaluation.num_steps=4",
    "evaluation.base_guidance_scales=[1.0]",
    "logging.sample_every=0",
    "logging.checkpoint_every=2",
    "logging.keep_checkpoints=2",
    "logging.progress=false",
]

NAN_REWARD = '''
import torch
from rewards import ShapesVerifier

_verifier = ShapesVerifier()
_calls = [0]


def nan_sometimes(media, prompts, metadata):
    """The shapes verifier's partial score, but NaN on every third call."""
    _calls[0] += 1
    scores = _verifier(media, prompts, metadata)["partial"]
    return scores * float("nan") if _calls[0] % 3 == 0 else scores
'''


@dataclass
class Outcome:
    scenario: str
    fault: str
    behaviour: str
    ok: bool


def command(output: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "flowrl.cli",
        "train",
        str(ROOT / "configs/shapes_nft.yaml"),
        *DRILL_RUN,
        f"training.steps={STEPS}",
        f"logging.output_dir={output}",
        *overrides,
    ]


def run(output: Path, *overrides: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{cwd}"}
    return subprocess.run(
        command(output, *overrides), capture_output=True, text=True, cwd=cwd, env=env, timeout=900
    )


def start(output: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        command(output, *overrides), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )


def wait_for_checkpoint(process: subprocess.Popen, output: Path, seconds: float = 300) -> None:
    """Return once the run in ``output`` has written its first checkpoint (or its process ended)."""
    deadline = time.monotonic() + seconds
    while (
        time.monotonic() < deadline
        and process.poll() is None
        and not list_checkpoints(output / "checkpoints")
    ):
        time.sleep(0.05)


def resume_until_done(output: Path, *overrides: str, attempts: int = 5) -> subprocess.CompletedProcess:
    for _ in range(attempts):
        result = run(output, *overrides, "resume=latest")
        if result.returncode == 0:
            return result
    raise RuntimeError(f"{output}: no successful resume in {attempts} attempts: {result.stderr[-500:]}")


def final_state(output: Path) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The final checkpoint's trained weights and the per-step training rewards."""
    _, payload = read_checkpoint(list_checkpoints(output / "checkpoints")[-1])
    rewards = [row["reward/mean"] for row in read_metrics(output / "metrics.jsonl") if "reward/mean" in row]
    return payload["policy"]["model"], rewards


def identical(output: Path, reference: Path) -> bool:
    weights, rewards = final_state(output)
    reference_weights, reference_rewards = final_state(reference)
    return rewards == reference_rewards and all(
        torch.equal(weights[name], value) for name, value in reference_weights.items()
    )


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --- scenarios ---------------------------------------------------------------------------------------


def kill_scenario(work: Path, reference: Path, seed: int, duration: float) -> list[Outcome]:
    rng = random.Random(seed)
    outcomes = []
    for trial in range(3):
        output = work / f"kill{trial}"
        moments = sorted(rng.uniform(0.1, 0.9) * duration for _ in range(2))
        for moment in moments:
            process = start(output, *(["resume=latest"] if output.exists() else []))
            time.sleep(moment)
            process.kill()
            process.wait()
        result = resume_until_done(output)
        same = identical(output, reference)
        outcomes.append(
            Outcome(
                "kill",
                f"kill -9 at {', '.join(f'{m:.1f}' for m in moments)} s, then resume=latest",
                f"completed {STEPS} steps; weights and rewards {'identical to' if same else 'DIFFER from'} "
                "the uninterrupted run" + ("" if result.returncode == 0 else f" (exit {result.returncode})"),
                same,
            )
        )
    return outcomes


def sigint_scenario(work: Path, reference: Path) -> list[Outcome]:
    # A drill started in the background by a shell without job control inherits SIGINT ignored, and so
    # would the run it starts (an ignored signal stays ignored across exec): Ctrl-C must reach the run as
    # it does from a terminal, so the drill handles SIGINT itself, which exec resets to the default.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    output = work / "sigint"
    process = start(output)
    wait_for_checkpoint(process, output)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    hint = "resume=latest" in stderr and "Traceback" not in stderr
    resume_until_done(output)
    same = identical(output, reference)
    return [
        Outcome(
            "sigint",
            "Ctrl-C (SIGINT) after the first checkpoint",
            f"exit {process.returncode}, {'a resume hint' if hint else 'NO resume hint'}; resumed run "
            f"{'identical to' if same else 'DIFFERS from'} the uninterrupted run",
            process.returncode == 130 and hint and same,
        )
    ]


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


CORRUPTIONS: dict[str, Callable[[Path], None]] = {
    "bit flip in policy.pt": lambda c: _flip(c / "policy.pt"),
    "optimizer.pt truncated to half": lambda c: (c / "optimizer.pt").write_bytes(
        (c / "optimizer.pt").read_bytes()[: (c / "optimizer.pt").stat().st_size // 2]
    ),
    "policy.pt emptied (0 bytes)": lambda c: (c / "policy.pt").write_bytes(b""),
    "manifest.json is {}": lambda c: (c / "manifest.json").write_text("{}"),
}


def corrupt_scenario(work: Path, reference: Path) -> list[Outcome]:
    partial = work / "partial"
    run(partial, f"training.steps={STEPS - 2}")
    outcomes = []
    for index, (fault, corrupt) in enumerate(CORRUPTIONS.items()):
        output = work / f"corrupt{index}"
        shutil.copytree(partial, output)
        corrupt(list_checkpoints(output / "checkpoints")[-1])
        result = run(output, "resume=latest")
        fell_back = "skipping unusable checkpoint" in result.stderr
        same = result.returncode == 0 and identical(output, reference)
        outcomes.append(
            Outcome(
                "corrupt",
                f"newest checkpoint: {fault}",
                f"{'fell back to the previous checkpoint' if fell_back else 'DID NOT fall back'}, completed; "
                f"{'identical to' if same else 'DIFFERS from'} the uninterrupted run",
                fell_back and same,
            )
        )
    output = work / "unusable"
    shutil.copytree(partial, output)
    for checkpoint in list_checkpoints(output / "checkpoints"):
        _flip(checkpoint / "policy.pt")
    metrics = (output / "metrics.jsonl").read_text()
    result = run(output, "resume=latest")
    one_line = len(result.stderr.strip().splitlines()) <= 3 and "Traceback" not in result.stderr
    kept = (output / "metrics.jsonl").read_text() == metrics
    outcomes.append(
        Outcome(
            "unusable",
            "every checkpoint corrupted, resume=latest",
            f"exit {result.returncode}: {last_line(result.stderr)[:110]}...; metrics.jsonl "
            f"{'untouched' if kept else 'CHANGED'}",
            result.returncode == 2 and one_line and kept,
        )
    )
    return outcomes


def disk_full_scenario(work: Path, reference: Path) -> list[Outcome]:
    fault = "run folder on a tmpfs that fills at the 2nd checkpoint"
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return [Outcome("disk_full", fault, "not run: mounting a tmpfs needs root", True)]
    checkpoint_bytes = sum(
        f.stat().st_size for f in list_checkpoints(reference / "checkpoints")[-1].iterdir()
    )
    mount_point = work / "small-disk"
    mount_point.mkdir()
    size = int(1.6 * checkpoint_bytes) + (2 << 20)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)])
    if mounted.returncode:
        return [Outcome("disk_full", fault, "not run: this machine cannot mount a tmpfs", True)]
    try:
        output = mount_point / "run"
        failed = run(output)
        leftovers = list((output / "checkpoints").glob(".tmp-*"))
        full = "No space left on device" in failed.stderr
        subprocess.run(["mount", "-o", f"remount,size={8 * size}", str(mount_point)], check=True)
        resume_until_done(output)
        same = identical(output, reference)
        return [
            Outcome(
                "disk_full",
                fault,
                f"exit {failed.returncode} ({'ENOSPC' if full else 'no ENOSPC'}), "
                f"{len(leftovers)} temporary folders left; with space freed the resumed run is "
                f"{'identical to' if same else 'DIFFERENT from'} the uninterrupted run",
                failed.returncode != 0 and full and not leftovers and same,
            )
        ]
    finally:
        subprocess.run(["umount", str(mount_point)])


def server_scenario(work: Path, down_seconds: float) -> list[Outcome]:
    port = free_port()
    server = start_server(port, "shapes_verifier")
    output = work / "server"
    url = f"http://127.0.0.1:{port}"
    rewards = (
        f"rewards={{verifier: {{reward: remote, key: partial, settings: {{url: '{url}', patience: 120}}}}}}"
    )
    training = start(output, rewards)
    wait_for_checkpoint(training, output)
    server.kill()
    server.wait()
    time.sleep(down_seconds)
    server = start_server(port, "shapes_verifier")
    try:
        _, stderr = training.communicate(timeout=600)
    finally:
        server.kill()
    steps = [row["step"] for row in read_metrics(output / "metrics.jsonl") if "reward/mean" in row]
    return [
        Outcome(
            "server",
            f"reward server killed after the first checkpoint, restarted {down_seconds:g} s later",
            f"exit {training.returncode}; {len(steps)} of {STEPS} steps trained"
            + ("" if training.returncode == 0 else f": {last_line(stderr)[:100]}"),
            training.returncode == 0 and steps == list(range(1, STEPS + 1)),
        )
    ]


def nan_scenario(work: Path) -> list[Outcome]:
    plugin_dir = work / "plugin"
    plugin_dir.mkdir()
    (plugin_dir / "nan_reward.py").write_text(NAN_REWARD)
    outcomes = []
    for on_error in ("raise", "skip_batch", "zero"):
        output = work / f"nan_{on_error}"
        result = run(
            output,
            f"rewards={{nan: {{reward: 'nan_reward:nan_sometimes', on_error: {on_error}}}}}",
            cwd=plugin_dir,
        )
        rows = [row for row in read_metrics(output / "metrics.jsonl") if row.get("step", 0) > 0]
        skipped = sum(row.get("skipped/reward_batch", 0) for row in rows)
        if on_error == "raise":
            line = last_line(result.stderr)
            ok = result.returncode == 1 and "non-finite" in line and "Traceback" not in result.stderr
            behaviour = f"exit {result.returncode}: {line[:110]}"
        else:
            ok = (
                result.returncode == 0
                and len(rows) == STEPS
                and (skipped > 0 if on_error == "skip_batch" else True)
            )
            behaviour = f"exit {result.returncode}; {len(rows)} steps" + (
                f", {skipped} skipped" if on_error == "skip_batch" else ", NaN batches scored 0"
            )
        outcomes.append(Outcome("nan", f"reward NaN on every 3rd batch, on_error: {on_error}", behaviour, ok))
    return outcomes


#: ``(what, config file text or None for configs/shapes_nft.yaml, overrides)``, each of which must be refused
BAD_CONFIGS: list[tuple[str, str | None, list[str]]] = [
    *[
        (f"override {o}", None, [o])
        for o in (
            "training.steps=0",
            "training.steps=-1",
            "training.steps=abc",
            "training.steps=1.5",
            "training.steps=true",
            "training.steps=.nan",
            "training.learning_rate=.nan",
            "training.learning_rate=.inf",
            "training.learning_rate=-1",
            "training.learning_rate=fast",
            "training.grad_clip=.inf",
            "training.grad_clip=0",
            "training.group_size=1",
            "training.max_consecutive_skips=0",
            "algorithm.beta=.nan",
            "algorithm.name=ppo",
            "algorithm.clip_range=0.2",
            "algorithm.timesteps=bogus",
            "sampler.solver=rk4",
            "sampler.num_steps=0",
            "sampler.guidance_scale=0.5",
            "model.backend=mystery",
            "model.name=/nonexistent-model",
            "rewards={}",
            "rewards={nope: 1.0}",
            "rewards={shapes_verifier: {weight: .nan}}",
            "rewards={shapes_verifier: {settings: {x: 1}}}",
            "rewards={shapes_verifier: {on_error: ignore}}",
            "rewards={shapes_verifier: {timeout: 0}}",
            "rewards={r: {reward: 'nomodule:thing'}}",
            "rewards={shapes_verifier: {colour: red}}",
            "data.prompts=missing.jsonl",
            "data.sampling=weird",
            "logging.tracker=mlflow",
            "logging.keep_checkpoints=0",
            "evaluation.guidance_scales=[0.5]",
            "evaluation.world=mars",
            "training.steps=[1,",
            "training.steps.x=1",
            "=5",
            "training.steps",
            "bogus=1",
            "resume=/nonexistent",
            "reward_aggregation=max",
        )
    ],
    (
        "prompts that do not divide over the batch",
        None,
        ["training.prompts_per_step=3", "training.group_size=3"],
    ),
    ("malformed YAML", "training: {steps: 3\n", []),
    ("a duplicate key", "training:\n  steps: 3\n  steps: 4\n", []),
    ("a list at the top", "- training\n", []),
    ("defaults that are not paths", "defaults: 5\n", []),
    ("defaults that form a cycle", "defaults: [bad.yaml]\n", []),
    (
        "a YAML tag that builds a Python object",
        "training: !!python/object/apply:os.system [echo pwned]\n",
        [],
    ),
    # bounded YAML, values checked before the folder is claimed
    *[
        (f"override {o}", None, [o])
        for o in (
            "training.steps=!!float",
            "training.steps=!!int x",
            "training.seed=-1",
            "rewards={x: {reward: 5}}",
            "rewards={v: {reward: shapes_verifier, key: partal}}",
            "rewards=*a",
        )
    ],
    (
        "a YAML alias bomb (9 ** 8 strings from 565 bytes)",
        "\n".join(
            ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
            + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 8)]
        ),
        [],
    ),
    ("YAML nested 50,000 deep", "x: " + "[" * 50_000 + "]" * 50_000 + "\n", []),
    ("a YAML complex key", "? [training, steps]\n: 3\n", []),
    ("a 2 MB config", "x: " + "1" * 2_000_000 + "\n", []),
]


def configs_scenario(work: Path) -> list[Outcome]:
    import contextlib
    import io

    from flowrl.cli import main as cli_main

    folder = work / "configs"
    folder.mkdir()
    (folder / "file").write_text("")
    (folder / "empty.txt").write_text("")
    (folder / "number.jsonl").write_text('{"prompt": 5}\n')
    (folder / "list.jsonl").write_text('["a red circle"]\n')
    cases = [
        *BAD_CONFIGS,
        ("an empty prompt file", None, [f"data.prompts={folder / 'empty.txt'}"]),
        ("a .jsonl whose prompt is a number", None, [f"data.prompts={folder / 'number.jsonl'}"]),
        ("a .jsonl whose record is a list", None, [f"data.prompts={folder / 'list.jsonl'}"]),
        ("output folder that is a file", None, [f"logging.output_dir={folder / 'file'}"]),
        ("a directory as config", str(folder), []),
        ("a non-UTF-8 config", "latin-1", []),
        ("a config that does not exist", str(folder / "missing.yaml"), []),
    ]
    clean, failures = 0, []
    for index, (what, text, overrides) in enumerate(cases):
        path = str(ROOT / "configs/shapes_nft.yaml")
        if text == "latin-1":
            path = str(folder / "latin1.yaml")
            Path(path).write_bytes("name: caf\xe9\n".encode("latin-1"))
        elif text is not None and text.startswith("/"):
            path = text
        elif text is not None:
            path = str(folder / ("bad.yaml" if "cycle" in what else f"case{index}.yaml"))
            Path(path).write_text(text)
        output = [f"logging.output_dir={folder / f'run{index}'}"]
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            try:
                status = cli_main(["train", path, *output, *overrides])
            except BaseException as error:  # a traceback would be a failure of the drill
                status = f"raised {type(error).__name__}"
        lines = stderr.getvalue().strip().splitlines()
        run_folder = folder / f"run{index}"
        written = [name for name in RUN_FILES if (run_folder / name).exists()]
        if status == 2 and len(lines) == 1 and "Traceback" not in lines[0] and not written:
            clean += 1
        else:
            failures.append(f"{what}: {status} {lines[-1:]}")
    return [
        Outcome(
            "configs",
            f"{len(cases)} bad config files and overrides",
            f"{clean} refused with one line and exit 2 before any model loaded or run file was written"
            + (f"; not clean: {failures}" if failures else ""),
            not failures,
        )
    ]


def _png(width: int, height: int, kind: str = "PNG") -> str:
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height)).save(buffer, format=kind)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def bad_requests() -> list[tuple[str, str, str, bytes, dict[str, str]]]:
    """``(what, method, path, body, headers)`` of requests the reward server must refuse."""
    small, marker = _png(32, 32), "ECHO-MARKER"
    ok = {"prompts": ["a red circle"], "metadata": [{}], "images": [small]}

    def body(**changes: object) -> bytes:
        return json.dumps({**ok, **changes}).encode()

    plain = {"content-type": "application/json"}
    return [
        (
            "150 MB announced, 20 bytes sent",
            "POST",
            "/score",
            b"{}" * 10,
            {**plain, "content-length": str(150 << 20)},
        ),
        ("a 70 MB body", "POST", "/score", (marker * (70 << 20 // len(marker)))[: 70 << 20].encode(), plain),
        ("an 8000x8000 PNG", "POST", "/score", body(images=[_png(8000, 8000)]), plain),
        (
            "100 images",
            "POST",
            "/score",
            body(images=[small] * 100, prompts=["p"] * 100, metadata=[{}] * 100),
            plain,
        ),
        ("not JSON", "POST", "/score", f"{marker} not json".encode(), plain),
        ("a JSON array", "POST", "/score", json.dumps([marker]).encode(), plain),
        ("no media", "POST", "/score", json.dumps({"prompts": [marker], "metadata": [{}]}).encode(), plain),
        ("media not base64", "POST", "/score", body(images=[marker + "!!"]), plain),
        ("a JPEG", "POST", "/score", body(images=[_png(32, 32, "JPEG")]), plain),
        ("metadata not objects", "POST", "/score", body(metadata=[marker]), plain),
        ("prompts not strings", "POST", "/score", body(prompts=[[marker]]), plain),
        ("2 prompts for 1 image", "POST", "/score", body(prompts=[marker, marker], metadata=[{}, {}]), plain),
        (
            "videos to an image reward",
            "POST",
            "/score",
            json.dumps({**ok, "images": None, "videos": [[small]]}).encode(),
            plain,
        ),
        ("images and videos", "POST", "/score", body(videos=[[small]]), plain),
        (
            "mixed image sizes",
            "POST",
            "/score",
            body(images=[small, _png(48, 48)], prompts=["a", "b"], metadata=[{}, {}]),
            plain,
        ),
        ("an empty batch", "POST", "/score", body(images=[], prompts=[], metadata=[]), plain),
        (
            "NaN in JSON",
            "POST",
            "/score",
            b'{"prompts": [NaN], "metadata": [{}], "images": ["' + small.encode() + b'"]}',
            plain,
        ),
        ("JSON nested 100000 deep", "POST", "/score", b"[" * 100_000 + b"]" * 100_000, plain),
        ("GET /score", "GET", "/score", b"", {}),
        ("/docs", "GET", "/docs", b"", {}),
        ("/openapi.json", "GET", "/openapi.json", b"", {}),
        ("an unknown path", "GET", f"/{marker}", b"", {}),
    ]


def _raw_request(port: int, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    """``(status, answer text)`` of one HTTP/1.1 request sent as given over a plain socket (a client
    library would refuse a Content-Length that does not match its body)."""
    lines = [f"{method} {path} HTTP/1.1", f"host: 127.0.0.1:{port}", "connection: close"]
    fields = {"content-length": str(len(body)), **headers} if method == "POST" else headers
    lines += [f"{key}: {value}" for key, value in fields.items()]
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        try:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        except OSError:  # the server answered and closed before taking the whole body
            pass
        answer = b""
        try:
            while chunk := sock.recv(1 << 16):
                answer += chunk
        except OSError:
            pass
    head = answer.split(b"\r\n", 1)[0].split()
    status = int(head[1]) if len(head) > 1 and head[1].isdigit() else 0
    return status, answer.decode("latin-1")


def requests_scenario(work: Path) -> list[Outcome]:
    import httpx

    port = free_port()
    server = start_server(port, "shapes_verifier")
    url = f"http://127.0.0.1:{port}"
    cases = bad_requests()
    clean, failures, slowest = 0, [], 0.0
    try:
        for what, method, path, content, headers in cases:
            start_time = time.perf_counter()
            status, text = _raw_request(port, method, path, content, headers)
            slowest = max(slowest, time.perf_counter() - start_time)
            if 400 <= status < 500 and "ECHO-MARKER" not in text and len(text) < 2000:
                clean += 1
            else:
                failures.append(f"{what}: {status} {text[-80:]!r}")
        healthy = httpx.get(url + "/health").status_code == 200
        from flowrl.shapes.grammar import shipped_prompts

        record = shipped_prompts("test")[0]
        good = {"prompts": [record["prompt"]], "metadata": [record], "images": [_png(32, 32)]}
        scored = httpx.post(url + "/score", json=good, timeout=60).status_code
    finally:
        server.kill()
    return [
        Outcome(
            "requests",
            f"{len(cases)} malformed or oversized requests to the reward server",
            f"{clean} answered 4xx without echoing input (slowest {slowest:.1f} s); server "
            f"{'healthy' if healthy else 'DOWN'}, a good request then scored ({scored})"
            + (f"; not clean: {failures}" if failures else ""),
            not failures and healthy and scored == 200,
        )
    ]


def folder_scenario(work: Path, reference: Path) -> list[Outcome]:
    """Two runs started into one folder at once; a ``resume=latest`` into a run that is still going."""
    output = work / "twins"
    twins = [start(output) for _ in range(2)]
    results = [(twin.wait(timeout=900), twin.stderr.read()) for twin in twins]
    codes = sorted(code for code, _ in results)
    refusal = last_line(next((err for code, err in results if code == 2), ""))
    steps = [row["step"] for row in read_metrics(output / "metrics.jsonl") if "reward/mean" in row]
    twins_ok = codes == [0, 2] and steps == list(range(1, STEPS + 1)) and identical(output, reference)
    live = work / "live"
    process = start(live)
    wait_for_checkpoint(process, live)
    second = run(live, "resume=latest")
    process.communicate(timeout=900)
    live_ok = (
        second.returncode == 2
        and "in use by a live flowrl run" in last_line(second.stderr)
        and process.returncode == 0
        and identical(live, reference)
    )
    return [
        Outcome(
            "folder",
            "two runs started into one folder at once",
            f"exit statuses {codes}; the refused one: {refusal!r}; the folder holds one run, "
            f"{'identical to' if twins_ok else 'NOT identical to'} the uninterrupted run",
            twins_ok,
        ),
        Outcome(
            "folder",
            "resume=latest into a run still going",
            f"refused (exit {second.returncode}: {last_line(second.stderr)!r}); the live run "
            f"{'completed identically' if live_ok else 'did NOT complete identically'}",
            live_ok,
        ),
    ]


def print_table(outcomes: list[Outcome]) -> None:
    width = max(len(o.fault) for o in outcomes)
    print(f"\n{'scenario':<10} {'fault':<{width}}  {'ok':<4} behaviour")
    for o in outcomes:
        print(f"{o.scenario:<10} {o.fault:<{width}}  {'yes' if o.ok else 'NO':<4} {o.behaviour}")
    print(f"\n{sum(o.ok for o in outcomes)} of {len(outcomes)} faults survived as intended")


SCENARIOS = (
    "configs",
    "requests",
    "load",
    "demo",
    "folder",
    "kill",
    "sigint",
    "corrupt",
    "disk_full",
    "server",
    "nan",
)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    parser.add_argument(
        "--out",
        default="runs/fault_drill.json",
        help="where the JSON goes (the tracked docs/fault_drill.json only when named)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="flowrl-drill-") as scratch:
        work = Path(scratch)
        reference = work / "reference"
        duration = [0.0]

        def with_reference(scenario: Callable[[], list[Outcome]]) -> Callable[[], list[Outcome]]:
            """``scenario`` after the uninterrupted reference run (made once, by the first that needs it)."""

            def run_it() -> list[Outcome]:
                if not reference.exists():
                    start_time = time.perf_counter()
                    result = run(reference)
                    if result.returncode:
                        raise SystemExit(f"the reference run failed: {result.stderr[-1000:]}")
                    duration[0] = time.perf_counter() - start_time
                    print(f"reference run: {STEPS} steps in {duration[0]:.0f} s", flush=True)
                return scenario()

            return run_it

        outcomes: list[Outcome] = []
        runners = {
            "configs": lambda: configs_scenario(work),
            "requests": lambda: requests_scenario(work),
            "load": lambda: [Outcome("load", *result) for result in load_scenario()],
            "demo": lambda: [Outcome("demo", *result) for result in demo_scenario(work)],
            "folder": with_reference(lambda: folder_scenario(work, reference)),
            "kill": with_reference(lambda: kill_scenario(work, reference, args.seed, duration[0])),
            "sigint": with_reference(lambda: sigint_scenario(work, reference)),
            "corrupt": with_reference(lambda: corrupt_scenario(work, reference)),
            "disk_full": with_reference(lambda: disk_full_scenario(work, reference)),
            "server": lambda: server_scenario(work, down_seconds=5.0),
            "nan": lambda: nan_scenario(work),
        }
        for name in args.only:
            found = runners[name]()
            for outcome in found:
                print(
                    f"  {outcome.scenario}: {outcome.fault}: {'ok' if outcome.ok else 'FAILED'}", flush=True
                )
            outcomes.extend(found)
    print_table(outcomes)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"steps": STEPS, "outcomes": [asdict(o) for o in outcomes]}, indent=2) + "\n"
    )
    print(f"wrote {args.out}")
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
