"""The online RL training loop, read top to bottom.

One step (:meth:`Trainer.train_step`), on every process (every collective runs everywhere):

  1. the step's global samples: ``prompts_per_step`` prompts x ``group_size``,
     the same list on every process; each process takes its slice and hands
     its records to the algorithm (``before_rollout``: off-policy data);
  2. rollouts by the rollout copy through ``samplers`` (CFG-free by default), in
     micro-batches, each handed to the reward scorer in the background as soon
     as it is decoded (:mod:`flowrl.rollout`);
  3. scores gathered from all processes; the algorithm's advantages on the
     global batch;
  4. the algorithm's training rows and draws, its loss over passes (e.g.
     timesteps) x micro-batches of rows, one backward each, in
     ``updates_per_step`` optimizer updates (clipping, optimizer and
     learning-rate step; a non-finite update is skipped on every process);
  5. the algorithm's copies (old, rollout) and the EMA follow the moved model;
  6. the step's metrics (:mod:`flowrl.step_metrics`) and sample grid; the loop
     adds curves, periodic evaluation and checkpoints.

All randomness of a step derives from ``(seed, step)`` and global sample
indices, so one process and two processes see the same data and noise, and a
resumed run continues exactly.

Longer than 400 lines on purpose: the loop is read top to bottom in one file (torchtune's recipes);
what it calls (algorithms, policy, rewards, checkpoints, evaluation) lives in its own modules.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import math
import time
from functools import partial
from pathlib import Path
from typing import IO, Any

import torch
import yaml
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, gather_object
from tqdm.auto import tqdm

from flowrl.advantages import RewardBatch
from flowrl.algorithms import TrainBatch, TrainRows
from flowrl.batches import check_batches, update_units
from flowrl.busy import OtherProcesses, warn_if_busy
from flowrl.checkpoint import (
    CheckpointError,
    checkpoint_config,
    clean_temporaries,
    read_checkpoint,
    resumable_checkpoint,
    write_checkpoint,
)
from flowrl.config_schema import ConfigError
from flowrl.evaluation import eval_row, evaluate, evaluation_world, summary_table, write_evaluation
from flowrl.generate import generate
from flowrl.models import backend_class
from flowrl.optimizer import optimizer_and_schedule
from flowrl.policy import REFERENCE, TUNED, build_policy
from flowrl.precision import resolve_mixed_precision
from flowrl.prompts import StepSamples, load_prompts, prompt_weights, step_samples
from flowrl.rng import rng_state, set_rng_state, step_generator
from flowrl.rollout import Rollout, rollout_and_score
from flowrl.run_folder import (
    INPUTS_KEY,
    check_resume_changes,
    claim_output_dir,
    input_fingerprints,
    package_versions,
    refuse_non_finite,
)
from flowrl.run_log import MetricsLog, log_grid_to_trackers, plot_curves, save_sample_grid
from flowrl.step_metrics import Updates, peak_memory_gb, reward_metrics, time_metrics, update_metrics
from flowrl.train_config import TrainConfig
from rewards import AsyncScorer, MultiReward
from samplers import select_rows

#: steps between redraws of curves.png (and at every evaluation and at the end)
CURVES_EVERY = 10


class Trainer:
    """Holds the run's parts; :meth:`train` is the loop of the module docstring."""

    def __init__(self, config: TrainConfig, accelerator: Accelerator | None = None) -> None:
        self.config = config
        self.other_processes = OtherProcesses()  # their CPU use, measured while this run sets up
        if config.training.threads:
            torch.set_num_threads(config.training.threads)
        tracker = None if config.logging.tracker == "none" else config.logging.tracker
        if tracker is not None and importlib.util.find_spec(tracker) is None:
            raise ValueError(
                f"logging.tracker={tracker!r} needs the {tracker} package: pip install -e '.[{tracker}]'"
            )
        self.accelerator = accelerator or Accelerator(
            cpu=not torch.cuda.is_available(), log_with=tracker, project_dir=config.logging.output_dir
        )
        acc = self.accelerator
        # Everything that can be checked without a model is checked before one loads; the main process
        # claims the folder (checked, and locked for the run's life) before anything is written to it.
        self.algorithm, self.local_images, self.micro_batches = check_batches(config, acc.num_processes)
        self.output_dir = Path(config.logging.output_dir)
        self.checkpoint_dir = self.output_dir / "checkpoints"
        self.prompts = load_prompts(config.data.prompts)
        if config.training.prompts_per_step > len(self.prompts):
            raise ValueError(
                f"training.prompts_per_step={config.training.prompts_per_step} is more than the "
                f"{len(self.prompts)} prompts of data.prompts={config.data.prompts!r}"
            )
        backend = backend_class(config.model.backend)
        precision, self.precision_line = resolve_mixed_precision(
            config.training.mixed_precision, acc.device, getattr(backend, "bf16_pays_on_cpu", False)
        )
        self.config = config = dataclasses.replace(
            config, training=dataclasses.replace(config.training, mixed_precision=precision)
        )
        self.run_lock = self.claim_run_folder()
        try:
            self.set_up()
        except BaseException:
            self.release_run_folder()
            raise

    def set_up(self) -> None:
        """Everything the run needs, loaded once the folder is the run's: the checkpoint to resume, prompts,
        reward, policy, optimizer and schedule."""
        config, acc = self.config, self.accelerator
        self.inputs = input_fingerprints(config.data.prompts, config.model.name)
        self.resume_from = self.checkpoint_to_resume()
        acc.wait_for_everyone()
        self.micro_batch = self.local_images // self.micro_batches
        begin = self.accelerator.process_index * self.local_images
        #: this process's rows of the step's global batch
        self.local_rows = slice(begin, begin + self.local_images)
        self.prompt_weights = prompt_weights(self.prompts, config.data.sampling, config.data.task_weights)
        self.reward = MultiReward(config.rewards)

        training = config.training
        torch.manual_seed(training.seed)
        self.policy = build_policy(
            config.model, self.algorithm.copies, training.ema_decay, training.mixed_precision
        ).to(acc.device)
        self.algorithm.prepare(self.policy)
        self.world = evaluation_world(config, self.policy)
        self.grid = self.policy.time_grid(config.sampler.num_steps, config.sampler.time_shift)
        self.optimizer, self.scheduler = optimizer_and_schedule(self.policy.trainable_parameters(), training)
        self.policy.prepare(acc.prepare)
        self.step = 0
        #: steps in a row whose update was skipped (non-finite loss or gradients, or a skipped reward batch)
        self.skips_in_a_row = 0

    # --- set-up and persistence ----------------------------------------------------------------------

    def write_config(self) -> None:
        record = {
            **self.config.to_dict(),
            "versions": package_versions(),
            "num_processes": self.accelerator.num_processes,
        }
        (self.output_dir / "config.yaml").write_text(yaml.safe_dump(record, sort_keys=False))

    def claim_run_folder(self) -> IO[str] | None:
        """The main process claims the run folder (:func:`claim_output_dir`: checked and locked for the run's
        life); every process raises its refusal, so none waits for a run that will not start."""
        lock, refusal = None, None
        if self.accelerator.is_main_process:
            try:
                lock = claim_output_dir(self.output_dir, self.config.resume)
            except ConfigError as error:
                refusal = str(error)
        if self.accelerator.num_processes > 1:
            refusal = broadcast_object_list([refusal])[0]
        if refusal:
            raise ConfigError(refusal)
        return lock

    def release_run_folder(self) -> None:
        """Let another run have the folder (the OS does it too when the process ends)."""
        if self.run_lock is not None:
            self.run_lock.close()
            self.run_lock = None

    def run_record(self) -> dict[str, Any]:
        """The config as plain data, with the fingerprints of the inputs read by path: what a checkpoint's
        manifest records and a resume is compared with."""
        return {**json.loads(json.dumps(self.config.to_dict())), INPUTS_KEY: self.inputs}

    def checkpoint_to_resume(self) -> Path | None:
        """The checkpoint ``config.resume`` names (``latest``: the newest usable one; None for a fresh
        start), after checking that the config changed only what a resumed run may change."""
        if not self.config.resume:
            return None
        path = resumable_checkpoint(self.config.resume, self.checkpoint_dir)
        if path is None:
            if self.accelerator.is_main_process:
                print(f"resume=latest: no checkpoint in {self.checkpoint_dir} yet; starting at step 0")
            return None
        saved = checkpoint_config(path)
        if saved is not None:
            check_resume_changes(saved, self.run_record(), str(path))
        # read now, before a model loads or a file is written: a checkpoint that cannot be read (a pickled
        # object refused by weights_only, a missing part) is refused while the folder is still as it was
        self.resume_payload = read_checkpoint(path)
        missing = sorted({"policy", "optimizer", "scheduler", "rng"} - set(self.resume_payload[1]))
        if missing:
            raise CheckpointError(
                f"checkpoint {path} lacks {', '.join(f'{name}.pt' for name in missing)}; it cannot resume a run"
            )
        return path

    def resume(self) -> None:
        """Load the checkpoint chosen at start-up (read by :meth:`checkpoint_to_resume`), if any."""
        path = self.resume_from
        if path is None:
            return
        self.step, payload = self.resume_payload
        del self.resume_payload  # its tensors are copied into the model and optimizer below
        self.policy.load_state_dict(payload["policy"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.scheduler.load_state_dict(payload["scheduler"])
        states = payload["rng"]
        if len(states) != self.accelerator.num_processes:
            raise ValueError(
                f"checkpoint {path} was written by {len(states)} processes; this run has "
                f"{self.accelerator.num_processes} (the global batch is the same, but RNG states are per process)"
            )
        self.algorithm.restore_state(payload.get("algorithm", {}), self.accelerator.process_index)
        set_rng_state(states[self.accelerator.process_index])
        if self.accelerator.is_main_process:
            print(f"resumed from {path} at step {self.step}")

    def save_checkpoint(self) -> None:
        """Write a checkpoint of the run (main process); never one of a non-finite model."""
        states, algorithm_state = gather_object([rng_state()]), self.algorithm.checkpoint_state()
        if self.accelerator.is_main_process:
            refuse_non_finite(self.policy.state_dict(), "checkpoint", self.step)
            write_checkpoint(
                self.checkpoint_dir,
                self.step,
                {
                    "policy": self.policy.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    "rng": states,
                    **({"algorithm": algorithm_state} if algorithm_state else {}),
                },
                keep=self.config.logging.keep_checkpoints,
                config=self.run_record(),
            )
        self.accelerator.wait_for_everyone()

    # --- evaluation ----------------------------------------------------------------------------------

    def evaluate(self, role: str, guidance_scale: float, name: str) -> dict[str, Any]:
        """Held-out GenEval-style scores of the ``tuned`` or ``reference`` (base) weights on the world's test
        prompts (main process)."""
        scores, media, items, rewards = evaluate(
            partial(generate, self.policy, role=role),
            self.world.prompts("test"),
            self.config.evaluation.images_per_task,
            self.config.evaluation.num_steps,
            guidance_scale,
            world=self.world,
            progress=f"eval {name}" if self.config.logging.progress else None,
        )
        write_evaluation(self.output_dir / "eval", name, scores, media, items, rewards, world=self.world)
        overall = self.world.score_key("overall")
        tqdm.write(
            f"eval {name}: {overall} {scores[overall]:.3f}, colour drift {scores['drift/colour_tv']:.3f} "
            f"({len(items)} samples)"
        )
        return scores

    # --- one step ------------------------------------------------------------------------------------

    def train_step(self, scorer: AsyncScorer) -> dict[str, Any]:
        """One step (the phases of the module docstring); returns its metrics row."""
        acc, started = self.accelerator, time.perf_counter()
        samples = self.step_samples()  # 1. the step's global samples; this process's slice
        local = samples.shard(acc.process_index, acc.num_processes)
        self.algorithm.before_rollout(self.policy, local.records, local.seeds, self.step)
        rollout = self.rollout_and_score(local.records, local.seeds, scorer)  # 2. rollouts, scored
        if self.any_process(rollout.scores is None):  # a reward with on_error: skip_batch failed somewhere
            return self.skipped_step("reward", time.perf_counter() - started)
        rewards, global_scores = self.gather_rewards(rollout.scores, samples.group_ids)  # 3. every process's
        advantages = self.algorithm.advantages(rewards)[self.local_rows].to(acc.device)  # on the global batch
        train_started = time.perf_counter()
        rows = self.algorithm.training_rows(  # 4. the algorithm's rows and draws; the optimizer updates
            rollout.chunks, advantages, self.reward.total(rollout.scores).to(acc.device), self.step
        )
        draws = self.algorithm.draw(
            step_generator(self.config.training.seed, self.step),
            len(samples.records),
            self.policy.sample_shape,
            self.grid,
            self.step,
        )
        updates = self.update(
            rows, rollout.cond, {key: value[:, self.local_rows] for key, value in draws.items()}
        )
        copies_started = time.perf_counter()
        step_end = self.algorithm.after_optimizer_step(self.step)  # 5. the copies (old, EMA) follow
        if updates.grad_norms:  # only a model that moved
            self.policy.move_copies(step_end.copy_decays)
        self.count_skip(not updates.grad_norms, "non-finite loss or gradients")
        updates.optimizer_seconds += time.perf_counter() - copies_started
        row = {  # 6. metrics (and sample grids)
            **reward_metrics(self.step, rewards, global_scores, samples.records),
            **update_metrics(updates, acc.reduce, self.scheduler.get_last_lr()[0]),
            **rows.log,
            **step_end.log,
            **time_metrics(rollout, updates, time.perf_counter() - train_started, started, acc),
        }
        self.save_samples(local, rollout)
        return row

    def step_samples(self) -> StepSamples:
        """The step's global list of samples (prompt records, group ids, seeds), the same on every process."""
        training = self.config.training
        return step_samples(
            self.prompts,
            self.step,
            training.prompts_per_step,
            training.group_size,
            training.seed,
            self.prompt_weights,
        )

    def gather_rewards(
        self, scores: dict[str, torch.Tensor], group_ids: list[int]
    ) -> tuple[RewardBatch, dict[str, torch.Tensor]]:
        """Every process's scores, and the reward batch (components, weights, totals, groups) they make."""
        acc = self.accelerator
        global_scores = {key: acc.gather(value.to(acc.device)).cpu() for key, value in scores.items()}
        rewards = RewardBatch(
            self.reward.components(global_scores),
            self.reward.weights,
            self.reward.total(global_scores),
            torch.tensor(group_ids),
        )
        return rewards, global_scores

    def rollout_and_score(self, records: list[dict], seeds: list[int], scorer: AsyncScorer) -> Rollout:
        """This process's rollouts of the step, scored in the background (:mod:`flowrl.rollout`)."""
        return rollout_and_score(
            self.policy,
            self.algorithm,
            self.config,
            self.grid,
            self.step,
            self.micro_batch,
            records,
            seeds,
            scorer,
        )

    def update(self, rows: TrainRows, cond: Any, draws: dict[str, torch.Tensor]) -> Updates:
        """The algorithm's loss over every (pass, micro-batch) unit, one backward each, weighted by its share
        of its update's rows; gradients synchronise on the last backward of each of the ``updates_per_step``
        updates. A non-finite loss or gradient anywhere skips that update on every process."""
        acc, policy, updates = self.accelerator, self.policy, Updates()
        for units in update_units(self.config, self.algorithm.passes, self.micro_batch, rows.count):
            update_losses = []
            update_rows = sum(part.stop - part.start for _, part in units)
            for index, (pass_index, part) in enumerate(units):
                batch = TrainBatch(
                    {key: value[part] for key, value in rows.data.items()},
                    select_rows(cond, rows.cond_index[part]),
                    rows.advantages[part],
                    {key: value[:, rows.cond_index[part].cpu()] for key, value in draws.items()},
                    None if rows.weights is None else rows.weights[part],
                )
                sync = index == len(units) - 1
                with contextlib.nullcontext() if sync else acc.no_sync(policy.model):
                    loss, stats = self.algorithm.loss(policy, batch, pass_index, self.step)
                    acc.backward(loss * ((part.stop - part.start) / update_rows))
                update_losses.append(loss.detach())
                for key, value in stats.items():
                    updates.statistics.setdefault(key, []).append(value.float().mean())
            updates.losses.extend(update_losses)
            started = time.perf_counter()
            grad_norm = float(
                acc.clip_grad_norm_(policy.trainable_parameters(), self.config.training.grad_clip)
            )
            finite = math.isfinite(grad_norm) and bool(torch.isfinite(torch.stack(update_losses)).all())
            if self.any_process(not finite):  # skipped: no optimizer or learning-rate step
                updates.skipped += 1
            else:
                updates.grad_norms.append(grad_norm)
                self.optimizer.step()
                self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            updates.optimizer_seconds += time.perf_counter() - started
        return updates

    # --- what a step logs ----------------------------------------------------------------------------

    def save_samples(self, local: StepSamples, rollout: Rollout) -> None:
        """Every ``logging.sample_every`` steps, a grid of this step's first samples (main process)."""
        every = self.config.logging.sample_every
        if not (self.accelerator.is_main_process and every and self.step % every == 0):
            return
        shown = min(16, len(local.records))
        grid_path = save_sample_grid(
            self.output_dir / "samples" / f"step_{self.step:06d}.png",
            torch.cat(rollout.media)[:shown].cpu(),
            [r["prompt"] for r in local.records[:shown]],
            self.reward.total(rollout.scores)[:shown],
        )
        log_grid_to_trackers(self.accelerator, "samples", grid_path, self.step)

    def any_process(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any process (a collective: every process must call it)."""
        return bool(
            self.accelerator.reduce(torch.tensor(float(flag), device=self.accelerator.device), "sum") > 0
        )

    def count_skip(self, skipped: bool, reason: str) -> None:
        """Count a step whose update was skipped; stop the run after ``max_consecutive_skips`` in a row."""
        self.skips_in_a_row = self.skips_in_a_row + 1 if skipped else 0
        limit = self.config.training.max_consecutive_skips
        if self.skips_in_a_row >= limit:
            raise FloatingPointError(
                f"step {self.step}: {self.skips_in_a_row} steps in a row skipped their update ({reason}); "
                f"stopping (training.max_consecutive_skips={limit}). The last checkpoint holds the last "
                "finite model"
            )

    def skipped_step(self, reason: str, seconds: float) -> dict[str, Any]:
        """The metrics row of a step whose rewards were skipped (no update, the copies stay)."""
        self.count_skip(True, f"{reason} batch skipped")
        return {
            "step": self.step,
            "skipped/reward_batch": 1,
            "time/step": seconds,
            "memory/peak_gb": peak_memory_gb(self.accelerator.device),
            "num_processes": self.accelerator.num_processes,
        }

    # --- the loop ------------------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        """Run :meth:`loop`, then let the run folder go, however the loop ended."""
        try:
            return self.loop()
        finally:
            self.release_run_folder()

    def loop(self) -> dict[str, Any]:
        config, acc = self.config, self.accelerator
        if acc.is_main_process:
            if acc.device.type == "cpu":
                warn_if_busy(torch.get_num_threads(), "flowrl train", self.other_processes)
            if self.precision_line:
                print(self.precision_line)
            self.output_dir.mkdir(parents=True, exist_ok=True)
            for leftover in clean_temporaries(self.checkpoint_dir):
                print(f"removed {leftover}, left by a checkpoint write that did not finish")
            self.write_config()
        acc.wait_for_everyone()
        self.resume()
        log = MetricsLog(self.output_dir / "metrics.jsonl", self.step) if acc.is_main_process else None
        if config.logging.tracker != "none":
            acc.init_trackers("flowrl", config={k: str(v) for k, v in self.config.to_dict().items()})
        summary_path = self.output_dir / "summary.json"
        base_scores: dict[str, Any] = {}
        if acc.is_main_process:
            if self.step == 0 or not summary_path.is_file():
                for scale in config.evaluation.base_guidance_scales:
                    base_scores[f"{scale:g}"] = self.evaluate(REFERENCE, scale, f"base_cfg{scale:g}")
                summary_path.write_text(json.dumps({"base": base_scores}, indent=2) + "\n")
                if "1" in base_scores and log is not None:  # the base, CFG-free, as step 0 of the eval curve
                    base_row = eval_row(base_scores["1"], self.world)
                    log.append({"step": 0, "time/elapsed": 0.0, **base_row})
            else:
                base_scores = json.loads(summary_path.read_text())["base"]
        elapsed_before = log.rows[-1]["time/elapsed"] if log and log.rows else 0.0
        start = time.perf_counter()
        progress = tqdm(
            total=config.training.steps,
            initial=self.step,
            desc="train",
            disable=not (acc.is_main_process and config.logging.progress),
            dynamic_ncols=True,
        )
        with AsyncScorer(self.reward) as scorer:
            while self.step < config.training.steps:
                self.step += 1
                row = self.train_step(scorer)
                row["time/elapsed"] = elapsed_before + time.perf_counter() - start
                if (
                    config.evaluation.every
                    and self.step % config.evaluation.every == 0
                    and self.step < config.training.steps
                ):
                    if acc.is_main_process:
                        scores = self.evaluate(TUNED, 1.0, f"step_{self.step:06d}_cfg1")
                        row.update(eval_row(scores, self.world))
                    acc.wait_for_everyone()
                if log is not None:
                    log.append(row)
                    if self.step % CURVES_EVERY == 0 or f"eval/{self.world.score_key('overall')}" in row:
                        self.redraw_curves(log)
                acc.log(row, step=self.step)
                if "reward/mean" in row:
                    progress.set_postfix(
                        reward=f"{row['reward/mean']:.3f}", s_per_step=f"{row['time/step']:.1f}"
                    )
                progress.update(1)
                if config.logging.checkpoint_every and self.step % config.logging.checkpoint_every == 0:
                    self.save_checkpoint()
        progress.close()
        if not config.logging.checkpoint_every or self.step % config.logging.checkpoint_every:
            self.save_checkpoint()
        return self.finish(base_scores, log)

    def redraw_curves(self, log: MetricsLog) -> None:
        plot_curves(log.rows, self.output_dir / "curves.png", str(self.output_dir), self.world.score_prefix)

    def finish(self, base_scores: dict[str, Any], log: MetricsLog | None) -> dict[str, Any]:
        """Save the tuned model, evaluate it, write ``summary.json`` and print the base-vs-tuned table."""
        acc = self.accelerator
        summary: dict[str, Any] = {}
        if acc.is_main_process:
            refuse_non_finite(self.policy.state_dict(), "tuned model", self.step)
            self.policy.save_pretrained(self.output_dir / "model")
            tuned = {
                f"{scale:g}": self.evaluate(TUNED, scale, f"tuned_cfg{scale:g}")
                for scale in self.config.evaluation.guidance_scales
            }
            final = eval_row(tuned["1"], self.world) if "1" in tuned else {}
            if log is not None and log.rows and final:
                log.rows[-1].update(final)
                log._rewrite()
                self.redraw_curves(log)
            summary = {
                "base": base_scores,
                "tuned": tuned,
                "steps": self.step,
                "output_dir": str(self.output_dir),
            }
            (self.output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
            if base_scores or tuned:
                print(summary_table(base_scores, tuned, self.world))
                print(f"eval grids:  {self.output_dir / 'eval'}")
            print(f"tuned model: {self.output_dir / 'model'}")
            print(f"curves:      {self.output_dir / 'curves.png'}")
        acc.wait_for_everyone()
        acc.end_training()
        return summary


def train(config: TrainConfig) -> dict[str, Any]:
    """Run a whole training from a validated config; returns the summary (main process)."""
    return Trainer(config).train()
