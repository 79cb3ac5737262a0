"""The fault drill's ``demo`` scenario: the demo app (in process, as its server calls it) over a runs folder
that holds one good run beside runs built to make it read outside the folder, fetch a URL or stall:

  symlinks       a run whose model/config.json, model.safetensors or checkpoint file is a symlink out
  model.name     a run of checkpoints only, whose config.yaml names a model directory outside
  SSRF           a run whose reward is ``remote`` with a URL of a listener on this machine
  alias bomb     a run whose config.yaml is a 9-level YAML alias bomb (a few hundred bytes)
  architecture   a run whose model/config.json describes 8192 x 128 layers (a few hundred bytes)
  broken         a config.yaml that is not YAML, a config.json that is not JSON, a dangling symlink

Every file the process opens is recorded (``sys.addaudithook``, the ``open`` event): none may lie in the
folder outside the runs root where the symlinks, the outside model and the secrets are. Each bad run must be
listed with a one-line reason, or refused in one line when asked for, and the good run must generate beside
them.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.app import build_app, compare  # noqa: E402
from app.runs import Catalog, survey_runs  # noqa: E402
from flowrl.checkpoint import write_checkpoint  # noqa: E402
from flowrl.models import SHIPPED_MODELS, load_shapes_model  # noqa: E402

Result = tuple[str, str, bool]  # fault, behaviour, ok
PROMPT = "a red circle"
opened: list[str] = []


def record_opens(event: str, arguments: tuple) -> None:
    if event == "open" and isinstance(arguments[0], (str, bytes, os.PathLike)):
        opened.append(os.fsdecode(arguments[0]))


def make_run(run: Path, model_name: str = "shapes-base", rewards: dict | None = None) -> Path:
    """A run of the shipped base model: ``model/``, a checkpoint, ``config.yaml`` and ``metrics.jsonl``."""
    model = load_shapes_model("shapes-base")
    model.save_pretrained(run / "model")
    state = model.state_dict()
    write_checkpoint(run / "checkpoints", 5, {"policy": {"model": state, "old": state}})
    config = {"model": {"name": model_name}, "rewards": rewards or {"shapes_verifier": 1.0}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    return run


def listener() -> tuple[http.server.ThreadingHTTPServer, list[str]]:
    """A local HTTP server that records the paths it is asked for."""
    requests: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            requests.append(self.path)
            self.send_response(200)
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *arguments: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, requests


def refusal(catalog: Catalog, source: str) -> str:
    """The one-line message asking for ``source`` gets, or ``"generated"``."""
    try:
        compare(PROMPT, 0, 1, 2, "euler", 1.0, 1.0, catalog.base, source, catalog=catalog)
    except (ValueError, FileNotFoundError) as error:
        return str(error)
    return "generated"


def build_runs(runs: Path, outside: Path, url: str) -> None:
    """The good run and the bad ones under ``runs``; what they point at under ``outside``."""
    make_run(runs / "good")
    outside.mkdir(parents=True)
    secret = outside / "secret.txt"
    secret.write_text("not the app's")
    shutil.copytree(SHIPPED_MODELS["shapes-base"], outside / "model")
    for name, target in {
        "link_config": "model/config.json",
        "link_weights": "model/model.safetensors",
        "link_checkpoint": "checkpoints/step_000005/manifest.json",
    }.items():
        link = make_run(runs / name) / target
        link.unlink()
        link.symlink_to(outside / ("model/config.json" if "config" in target else "secret.txt"))
    pointing = make_run(runs / "outside_model", model_name=str(outside / "model"))
    shutil.rmtree(pointing / "model")  # checkpoints only: they load on the base its config.yaml names
    make_run(runs / "ssrf", rewards={"judge": {"reward": "remote", "settings": {"url": url}}})
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    (make_run(runs / "alias_bomb") / "config.yaml").write_text("\n".join(levels) + "\n")
    huge = make_run(runs / "huge_architecture") / "model" / "config.json"
    architecture = json.loads(huge.read_text())
    architecture.update(hidden_size=8192, depth=128, text_hidden_size=8192, text_layers=128)
    huge.write_text(json.dumps(architecture))
    (make_run(runs / "bad_yaml") / "config.yaml").write_text("model: [unclosed\n")
    (make_run(runs / "bad_json") / "model" / "config.json").write_text("{not json")
    (make_run(runs / "dangling") / "notes.txt").symlink_to(outside / "missing")


def demo_scenario(work: Path) -> list[Result]:
    runs, outside = work / "demo" / "runs", work / "demo" / "outside"
    server, requests = listener()
    url = f"http://127.0.0.1:{server.server_address[1]}/secret-path"
    build_runs(runs, outside, url)
    sys.addaudithook(record_opens)
    opened.clear()
    catalog = Catalog(runs, "shapes-base")
    started = time.perf_counter()
    offered, left_out = survey_runs(runs)
    survey_seconds = time.perf_counter() - started
    reasons = dict(left_out)
    asked = {name: refusal(catalog, str(runs / name)) for name in ("ssrf", "outside_model")}
    asked["outside_model checkpoint"] = refusal(catalog, str(runs / "outside_model/checkpoints/step_000005"))
    for name in reasons:
        asked[name] = refusal(catalog, str(runs / name))
    page = build_app(None, "shapes-base", runs)
    listed = any(
        isinstance(getattr(block, "value", None), str) and block.value.startswith("Not offered:")
        for block in page.blocks.values()
    )
    good = refusal(catalog, str(runs / "good"))
    server.shutdown()
    outside_reads = sorted(
        {path for path in opened if Path(path).resolve().is_relative_to(outside.resolve())}
    )
    one_line = all("\n" not in text and len(text) < 400 for text in [*reasons.values(), *asked.values()])
    expected_out = {"link_config", "link_weights", "link_checkpoint", "alias_bomb", "huge_architecture"}
    expected_out |= {"bad_yaml", "bad_json", "dangling"}
    return [
        (
            "symlinks out (config.json, weights, checkpoint file), alias bomb, huge architecture, broken "
            "config.yaml / config.json, dangling symlink",
            f"{len(offered)} runs offered ({', '.join(path.name for path in offered)}); "
            f"{len(reasons)} listed with a one-line reason in {survey_seconds:.2f} s "
            f"({'; '.join(f'{name}: {reason[:90]}' for name, reason in sorted(reasons.items()))}); "
            f"each refused when asked for; the page lists them: {listed}",
            set(reasons) == expected_out
            and one_line
            and listed
            and all(asked[name] != "generated" for name in reasons),
        ),
        (
            "a run of checkpoints whose config.yaml names a model directory outside",
            f"refused: {asked['outside_model checkpoint'][:90]}",
            asked["outside_model checkpoint"].startswith("This run's config.yaml names a base model"),
        ),
        (
            "a run whose reward is `remote` with a local URL (SSRF)",
            f"refused: {asked['ssrf'][:100]}; requests the listener got: {len(requests)}",
            "--trust-run-code" in asked["ssrf"] and not requests and "secret-path" not in asked["ssrf"],
        ),
        (
            "files opened outside the runs root, and the good run beside the bad ones",
            f"{len(opened)} files opened, {len(outside_reads)} outside the runs root {outside_reads[:3]}; "
            f"the good run: {good}",
            not outside_reads and good == "generated",
        ),
    ]


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="flowrl-drill-demo-") as scratch:
        for fault, behaviour, ok in demo_scenario(Path(scratch)):
            print(f"{'ok ' if ok else 'NO '} {fault}: {behaviour}", flush=True)
