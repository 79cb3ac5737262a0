"""One live run per run folder, and a resumed run reads what it was trained with. Two runs started at once into one folder, or a
resume into a run that is still going, are refused with one line naming the live process; the live run's
files (its half-written checkpoint included) are left alone."""

import os
import shutil
import subprocess
import sys

import pytest
from test_reliability import TINY_RUN, tiny_config, train

from flowrl.config import ConfigError
from flowrl.run_folder import lock_run_folder
from flowrl.run_log import read_metrics
from flowrl.trainer import Trainer


def held_lock(output_dir):
    """The folder's lock, taken by this (test) process as a live run would hold it."""
    output_dir.mkdir(parents=True, exist_ok=True)
    return lock_run_folder(output_dir)


def test_a_run_into_a_live_runs_folder_is_refused_naming_the_holder(tmp_path, tiny_model_dir):
    output = tmp_path / "run"
    lock = held_lock(output)
    holder = f"pid {os.getpid()} on "
    for resume in ([], ["resume=latest"]):
        with pytest.raises(ConfigError, match=f"is in use by a live flowrl run \\({holder}") as refused:
            Trainer(tiny_config(tiny_model_dir, output, "training.steps=1", *resume))
        assert "\n" not in str(refused.value)
    assert sorted(path.name for path in output.iterdir()) == [".flowrl.lock"]  # nothing written
    lock.close()
    assert train(tiny_model_dir, output, "training.steps=1")["steps"] == 1


def test_resume_into_a_live_run_leaves_its_half_written_checkpoint(tmp_path, tiny_model_dir):
    output = tmp_path / "run"
    train(tiny_model_dir, output, "training.steps=1")
    half_written = output / "checkpoints" / ".tmp-step_000002-live"
    half_written.mkdir()
    lock = held_lock(output)
    with pytest.raises(ConfigError, match="in use by a live flowrl run"):
        train(tiny_model_dir, output, "training.steps=2", "resume=latest")
    assert half_written.is_dir()
    lock.close()
    assert train(tiny_model_dir, output, "training.steps=2", "resume=latest")["steps"] == 2
    assert not half_written.exists()  # the holder cleans up what a killed write left


def test_a_failed_start_lets_the_folder_go(tmp_path, tiny_model_dir):
    """A run refused after it claimed the folder (here: a changed setting on resume) does not keep it."""
    output = tmp_path / "run"
    train(tiny_model_dir, output, "training.steps=1")
    with pytest.raises(ConfigError, match="training.learning_rate"):
        Trainer(tiny_config(tiny_model_dir, output, "training.learning_rate=0.01", "resume=latest"))
    lock_run_folder(output).close()  # free again


def test_two_runs_started_at_once_into_one_folder_one_trains_the_other_is_refused(tmp_path, tiny_model_dir):
    output = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "flowrl.cli",
        "train",
        "configs/shapes_nft.yaml",
        *TINY_RUN,
        "training.steps=3",
        "training.threads=1",
        f"model.name={tiny_model_dir}",
        f"logging.output_dir={output}",
    ]
    runs = [subprocess.Popen(command, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(run.wait(timeout=300), run.stderr.read()) for run in runs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refusal = next(stderr for code, stderr in results if code == 2).strip().splitlines()
    assert len(refusal) == 1 and (
        "in use by a live flowrl run" in refusal[0] or "already holds a run" in refusal[0]
    )
    assert [row["step"] for row in read_metrics(output / "metrics.jsonl")] == [0, 1, 2, 3]


def test_resume_refuses_a_prompts_file_or_model_directory_changed_at_the_same_path(tmp_path, tiny_model_dir):
    """The contents of the inputs read by path are fingerprinted (sha256) in every
    checkpoint's manifest and compared on resume; the same path with other contents is refused."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\na blue square\n")
    output = tmp_path / "run"
    inputs = [f"data.prompts={prompts}", "rewards={brightness: 1.0}", "evaluation.base_guidance_scales=[]"]
    Trainer(tiny_config(model, output, *inputs, "training.steps=1")).train()
    prompts.write_text("a red circle\na green triangle\n")
    with pytest.raises(
        ConfigError, match=r"the content of data.prompts='.*prompts.txt' changed since checkpoint"
    ):
        Trainer(tiny_config(model, output, *inputs, "training.steps=2", "resume=latest"))
    prompts.write_text("a red circle\na blue square\n")
    weights = next(model.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    with pytest.raises(ConfigError, match=r"the content of model.name='.*model' changed"):
        Trainer(tiny_config(model, output, *inputs, "training.steps=2", "resume=latest"))
    shutil.rmtree(model)
    shutil.copytree(tiny_model_dir, model)
    summary = Trainer(tiny_config(model, output, *inputs, "training.steps=2", "resume=latest")).train()
    assert summary["steps"] == 2


def test_resume_from_a_missing_checkpoint_is_refused_before_the_folder_exists(tmp_path, tiny_model_dir):
    output = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"resume='/nonexistent/step_000001': no such checkpoint directory"):
        Trainer(tiny_config(tiny_model_dir, output, "training.steps=1", "resume=/nonexistent/step_000001"))
    assert not output.exists()
