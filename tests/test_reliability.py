"""Failures found by probing flowrl, each reproduced the way it was found: nothing in a checkpoint runs code, no run
history is lost or mixed, non-finite numbers never train or get saved (faults in rewards and one-line
errors: test_faults_and_errors.py)."""

import io
import json
import os
import pickle
import signal
import warnings
from pathlib import Path

import pytest
import torch

from flowrl.checkpoint import (
    CheckpointError,
    clean_temporaries,
    list_checkpoints,
    read_checkpoint,
    resumable_checkpoint,
    write_checkpoint,
)
from flowrl.config import ConfigError, load_config
from flowrl.run_log import read_metrics
from flowrl.trainer import Trainer

TINY_RUN = [
    "training.prompts_per_step=2",
    "training.group_size=4",
    "training.micro_batch_size=4",
    "training.updates_per_step=1",
    "training.learning_rate=0.001",
    "sampler.num_steps=2",
    "algorithm.train_timesteps=1",
    "evaluation.images_per_task=1",
    "evaluation.num_steps=1",
    "evaluation.base_guidance_scales=[1.0]",
    "logging.sample_every=0",
    "logging.checkpoint_every=1",
    "logging.progress=false",
]


def tiny_config(model_dir, output_dir, *overrides):
    return load_config(
        "configs/shapes_nft.yaml",
        [*TINY_RUN, f"model.name={model_dir}", f"logging.output_dir={output_dir}", *overrides],
    )


def train(model_dir, output_dir, *overrides):
    return Trainer(tiny_config(model_dir, output_dir, *overrides)).train()


# --- nothing in a checkpoint runs code -------------------------------------------------------------


class _Exploit:
    """Unpickling this runs a shell command (what a malicious ``policy.pt`` would do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _forge(checkpoint: Path, files: dict[str, bytes], manifest_files=None):
    """A checkpoint folder whose manifest vouches for ``files`` (sizes and hashes right)."""
    import hashlib

    checkpoint.mkdir(parents=True)
    for name, data in files.items():
        (checkpoint / name).write_bytes(data)
    listed = manifest_files or {
        name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()
    }
    (checkpoint / "manifest.json").write_text(json.dumps({"step": 3, "files": listed}))


def test_a_pickled_exploit_in_a_checkpoint_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    checkpoint = tmp_path / "checkpoints" / "step_000003"
    _forge(checkpoint, {"policy.pt": pickle.dumps(_Exploit(marker))})
    with pytest.raises(CheckpointError, match="does not load it"):
        read_checkpoint(checkpoint)
    assert not marker.exists()


def test_manifest_file_names_are_confined_to_their_folder(tmp_path):
    outside = tmp_path / "x" / "policy.pt"
    outside.parent.mkdir()
    torch.save({"w": torch.ones(2)}, outside)
    import hashlib

    data = outside.read_bytes()
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000003"
    listed = {"../../../x/policy.pt": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
    _forge(checkpoint, {}, manifest_files=listed)
    with pytest.raises(CheckpointError, match="only plain names"):
        read_checkpoint(checkpoint)


def test_checkpoints_hold_only_plain_types_and_round_trip(tmp_path):
    write_checkpoint(tmp_path, 1, {"state": {"w": torch.arange(3.0), "note": "x", "pair": (1, 2.5)}})
    step, payload = read_checkpoint(tmp_path / "step_000001")
    assert step == 1 and payload["state"]["note"] == "x" and payload["state"]["pair"] == (1, 2.5)


def test_checkpoints_of_earlier_versions_with_numpy_rng_states_still_load_and_restore(tmp_path):
    import random

    import numpy as np

    from flowrl.rng import set_rng_state

    np.random.seed(7)
    old_style = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    expected = np.random.rand(3)
    write_checkpoint(tmp_path, 1, {"rng": [old_style]})
    _, payload = read_checkpoint(tmp_path / "step_000001")
    set_rng_state(payload["rng"][0])
    assert np.array_equal(np.random.rand(3), expected)


# --- nothing lost or mixed -------------------------------------------------------------------------


def test_an_empty_manifest_falls_back_to_the_previous_checkpoint(tmp_path):
    for step in (1, 2):
        write_checkpoint(tmp_path, step, {"x": torch.tensor(step)}, keep=2)
    (tmp_path / "step_000002" / "manifest.json").write_text("{}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resumable_checkpoint("latest", tmp_path) == tmp_path / "step_000001"
    assert any("lacks its 'step' or 'files'" in str(w.message) for w in caught)


def test_pruning_keeps_the_checkpoint_just_written_even_below_older_steps(tmp_path):
    for step in (20, 30):
        write_checkpoint(tmp_path, step, {"x": torch.tensor(step)}, keep=2)
    write_checkpoint(tmp_path, 10, {"x": torch.tensor(10)}, keep=2)
    assert [path.name for path in list_checkpoints(tmp_path)] == ["step_000010", "step_000030"]
    assert (tmp_path / "latest").read_text().strip() == "step_000010"


def test_a_ctrl_c_during_a_checkpoint_write_finishes_the_write_then_interrupts(tmp_path, monkeypatch):
    """SIGINT mid-``torch.save`` (a real signal to this process): the checkpoint is completed and verified,
    then KeyboardInterrupt is raised (not the RuntimeError a broken zip writer raises)."""
    real_save = torch.save

    def interrupted_save(value, handle):
        os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C would, while the file is half written
        real_save(value, handle)

    monkeypatch.setattr(torch, "save", interrupted_save)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        with pytest.raises(KeyboardInterrupt):
            write_checkpoint(tmp_path, 4, {"x": torch.tensor(4), "y": torch.tensor(5)})
    finally:
        signal.signal(signal.SIGINT, previous)
    assert resumable_checkpoint("latest", tmp_path) == tmp_path / "step_000004"
    step, payload = read_checkpoint(tmp_path / "step_000004")
    assert step == 4 and payload["y"].item() == 5


def test_a_failed_write_leaves_no_temporary_folder_and_leftovers_are_cleaned(tmp_path, monkeypatch):
    write_checkpoint(tmp_path, 1, {"x": torch.tensor(1)})
    real_save = torch.save

    def disk_full(value, handle):
        real_save(value, handle)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_checkpoint(tmp_path, 2, {"x": torch.tensor(2)})
    assert sorted(path.name for path in tmp_path.iterdir()) == ["latest", "step_000001"]
    (tmp_path / ".tmp-step_000003-999").mkdir()  # what a kill -9 mid-write leaves
    assert [path.name for path in clean_temporaries(tmp_path)] == [".tmp-step_000003-999"]
    assert resumable_checkpoint("latest", tmp_path) == tmp_path / "step_000001"


def test_resume_latest_with_every_checkpoint_unusable_is_an_error_and_keeps_the_metrics(
    tmp_path, tiny_model_dir
):
    output = tmp_path / "run"
    train(tiny_model_dir, output, "training.steps=2")
    for checkpoint in list_checkpoints(output / "checkpoints"):
        (checkpoint / "policy.pt").write_bytes(b"garbage")
    rows_before = (output / "metrics.jsonl").read_text()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CheckpointError, match="none of the 2 checkpoints"):
            train(tiny_model_dir, output, "training.steps=3", "resume=latest")
    assert (output / "metrics.jsonl").read_text() == rows_before


def test_a_new_run_into_a_run_folder_is_refused_and_resume_refuses_changed_settings(tmp_path, tiny_model_dir):
    output = tmp_path / "run"
    train(tiny_model_dir, output, "training.steps=1")
    with pytest.raises(ConfigError, match="already holds a run .*resume=latest"):
        Trainer(tiny_config(tiny_model_dir, output, "training.steps=2"))
    with pytest.raises(ConfigError, match=r"training.learning_rate: 0.001 -> 0.01"):
        Trainer(
            tiny_config(
                tiny_model_dir, output, "training.steps=2", "training.learning_rate=0.01", "resume=latest"
            )
        )
    summary = train(tiny_model_dir, output, "training.steps=2", "logging.sample_every=1", "resume=latest")
    assert summary["steps"] == 2
    assert [row["step"] for row in read_metrics(output / "metrics.jsonl")] == [0, 1, 2]


@pytest.mark.parametrize(
    "override, message",
    [
        ("algorithm.beta=.nan", "algorithm.beta=nan is not allowed; expected a finite number"),
        ("training.learning_rate=.nan", "expected a finite number"),
        ("training.grad_clip=.inf", "training.grad_clip=inf is not allowed; expected a finite number"),
        ("training.learning_rate=nan", "expected a finite number"),
    ],
)
def test_non_finite_numbers_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("configs/shapes_nft.yaml", [override])


def _nan_loss_on(trainer, steps):
    loss = trainer.algorithm.loss

    def maybe_nan(policy, batch, pass_index, step):
        value, stats = loss(policy, batch, pass_index, step)
        return (value * float("nan") if step in steps else value), stats

    trainer.algorithm.loss = maybe_nan


def test_a_non_finite_loss_skips_its_update_and_too_many_in_a_row_stop_the_run(tmp_path, tiny_model_dir):
    trainer = Trainer(tiny_config(tiny_model_dir, tmp_path / "one", "training.steps=3"))
    _nan_loss_on(trainer, {2})
    trainer.train()
    rows = [row for row in read_metrics(tmp_path / "one" / "metrics.jsonl") if row["step"] > 0]
    assert [row["skipped/updates"] for row in rows] == [0, 1, 0]
    _, payload = read_checkpoint(tmp_path / "one" / "checkpoints" / "step_000003")
    assert all(torch.isfinite(value).all() for value in payload["policy"]["model"].values())

    trainer = Trainer(
        tiny_config(tiny_model_dir, tmp_path / "all", "training.steps=5", "training.max_consecutive_skips=2")
    )
    _nan_loss_on(trainer, {1, 2, 3, 4, 5})
    with pytest.raises(FloatingPointError, match="2 steps in a row skipped their update"):
        trainer.train()
    _, payload = read_checkpoint(tmp_path / "all" / "checkpoints" / "step_000001")
    assert all(torch.isfinite(value).all() for value in payload["policy"]["model"].values())
    with torch.no_grad():
        next(iter(trainer.policy.trainable_parameters())).fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="not saving the checkpoint at step 2: non-finite values"):
        trainer.save_checkpoint()
    assert [path.name for path in list_checkpoints(tmp_path / "all" / "checkpoints")] == ["step_000001"]


@pytest.mark.parametrize("fault", ["pickled object", "no optimizer.pt"])
def test_a_checkpoint_that_cannot_resume_is_refused_before_anything_is_written(
    tmp_path, tiny_model_dir, fault
):
    """``resume=<path>`` to a checkpoint holding a pickled object, or lacking a
    part, is one line before the model loads or the (new) run folder holds anything but its lock."""
    marker = tmp_path / "pwned"
    checkpoint = tmp_path / "elsewhere" / "step_000003"
    if fault == "pickled object":
        _forge(checkpoint, {"policy.pt": pickle.dumps(_Exploit(marker))})
        message = "does not load it"
    else:
        buffer = io.BytesIO()
        torch.save({"model": {}}, buffer)
        _forge(checkpoint, {"policy.pt": buffer.getvalue()})
        message = "lacks optimizer.pt, rng.pt, scheduler.pt"
    output = tmp_path / "run"
    with pytest.raises(CheckpointError, match=message):
        Trainer(tiny_config(tiny_model_dir, output, "training.steps=4", f"resume={checkpoint}"))
    assert sorted(path.name for path in output.iterdir()) == [".flowrl.lock"]
    assert not marker.exists()
    assert train(tiny_model_dir, output, "training.steps=1")["steps"] == 1  # the fixed re-run is not refused
