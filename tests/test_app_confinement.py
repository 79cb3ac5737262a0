"""In the demo only what lies inside the runs folder is read (every entry of a run, the base model a
checkpoint loads on), a run cannot make the app send requests, and a bad run folder is listed with its reason
while the others keep serving."""

import http.server
import shutil
import threading

import pytest
import yaml
from app_runs import make_run
from test_app import NOT_OFFERED, PROMPT, _error

from app.app import build_app, compare
from app.runs import Catalog, find_runs, left_out_runs

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def catalog(tmp_path, tiny_model_dir):
    """What the app offers: the runs under ``tmp_path/runs``, with the tiny model as the base."""
    return Catalog(tmp_path / "runs", str(tiny_model_dir))


@pytest.fixture
def run(tmp_path, tiny_model, tiny_model_dir):
    return make_run(tmp_path / "runs" / "run_a", tiny_model_dir, tiny_model)


def test_a_checkpoint_loads_only_on_an_offered_base_model(catalog, tmp_path, tiny_model, tiny_model_dir):
    """A run's config.yaml cannot make the app read a model directory it does not offer."""
    elsewhere = tmp_path / "elsewhere" / "model"
    shutil.copytree(tiny_model_dir, elsewhere)
    run = make_run(catalog.root / "pointing", tiny_model_dir, tiny_model)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"]["name"] = str(elsewhere)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    checkpoint = run / "checkpoints" / "step_000005"
    message = _error(catalog, checkpoint)
    assert message.startswith("This run's config.yaml names a base model the app does not offer")
    assert "elsewhere" not in message
    config["model"]["name"] = str(tiny_model_dir)  # the offered base: loads
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert compare(
        PROMPT, 0, 1, 1, "euler", 1.0, 1.0, catalog.base, str(checkpoint), catalog=catalog
    ).seeds == [0]


@pytest.mark.parametrize(
    "where", ["model/config.json", "model/model.safetensors", "checkpoint file", "top level"]
)
def test_any_file_symlinked_out_of_the_root_keeps_the_run_out(
    catalog, tmp_path, tiny_model, tiny_model_dir, where
):
    """Every entry of a run, at any depth, must resolve inside the runs root."""
    run = make_run(catalog.root / "leaky", tiny_model_dir, tiny_model)
    secret = tmp_path / "elsewhere" / "secret"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_bytes(b"not the app's")
    checkpoint = run / "checkpoints" / "step_000005"
    target = {
        "model/config.json": run / "model" / "config.json",
        "model/model.safetensors": run / "model" / "model.safetensors",
        "checkpoint file": next(path for path in checkpoint.iterdir() if path.name != "manifest.json"),
        "top level": run / "config.json",
    }[where]
    target.unlink(missing_ok=True)
    target.symlink_to(secret)
    assert run not in find_runs(catalog.root)
    for source in (run, checkpoint):
        assert _error(catalog, source).startswith(NOT_OFFERED)


def test_bad_run_folders_are_listed_with_their_reason_and_the_good_ones_still_serve(
    catalog, run, tmp_path, tiny_model, tiny_model_dir
):
    """A malformed config.yaml, a malformed model/config.json, a dangling symlink out of the
    root: each run is left out with a one-line reason, at start-up or appearing later, and the others work."""
    bomb = make_run(catalog.root / "bomb", tiny_model_dir, tiny_model)
    (bomb / "config.yaml").write_text("a: &a [1]\nb: [*a, *a]\n")
    broken = make_run(catalog.root / "broken", tiny_model_dir, tiny_model)
    (broken / "model" / "config.json").write_text("{not json")
    dangling = make_run(catalog.root / "dangling", tiny_model_dir, tiny_model)
    (dangling / "notes.txt").symlink_to(tmp_path / "elsewhere-missing")
    assert find_runs(catalog.root) == [run]
    reasons = dict(left_out_runs(catalog.root))
    assert "aliases (*name) are not allowed" in reasons["bomb"]
    assert reasons["broken"].startswith("model/config.json is not a JSON model config")
    assert reasons["dangling"] == "a file in it leads outside the runs folder"
    assert all("\n" not in reason for reason in reasons.values())
    assert compare(PROMPT, 0, 1, 1, "euler", 1.0, 1.0, catalog.base, str(run), catalog=catalog).seeds == [0]
    listed = build_app(None, str(tiny_model_dir), catalog.root)
    texts = [getattr(block, "value", "") for block in listed.blocks.values()]
    assert any(isinstance(text, str) and text.startswith("Not offered: `bomb`") for text in texts)


@pytest.mark.parametrize("nested", [False, True])
def test_a_run_cannot_make_the_app_send_requests_unless_trusted(catalog, tiny_model, tiny_model_dir, nested):
    """The registered ``remote`` reward with the run's URL (directly, or built by name inside
    another reward's settings) is refused before any connection, and the URL is not echoed."""
    requests = []

    class Listener(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            requests.append(self.path)
            self.send_response(200)
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Listener)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/secret-path"
    remote = {"reward": "remote", "settings": {"url": url, "startup_patience": 1.0}}
    entry = {"reward": "frame_average", "settings": remote} if nested else remote
    run = make_run(catalog.root / "caller", tiny_model_dir, tiny_model, rewards={"judge": entry})
    try:
        message = _error(catalog, run)
    finally:
        server.shutdown()
    assert "sets reward 'remote' with setting 'url' in entry 'judge'" in message
    assert "--trust-run-code" in message and "secret-path" not in message and "127.0.0.1" not in message
    assert requests == []
