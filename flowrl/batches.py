"""How a step's global batch splits: over processes, into micro-batches, and its backward units (the
algorithm's loss passes x micro-batches of training rows) into ``updates_per_step`` optimizer updates."""

from __future__ import annotations

from flowrl.algorithms import Algorithm, build_algorithm
from flowrl.config_schema import ConfigError
from flowrl.train_config import TrainConfig

#: the backward units of one optimizer update: (loss pass, rows of a micro-batch)
Units = list[tuple[int, slice]]


def update_units(config: TrainConfig, passes: int, micro_batch: int, num_rows: int) -> list[Units]:
    """The (pass, rows) backward units of a step, split into ``updates_per_step`` optimizer updates.

    Units are every one of the algorithm's ``passes`` over every micro-batch of a process's ``num_rows``
    training rows.
    """
    units = [
        (pass_index, slice(begin, min(begin + micro_batch, num_rows)))
        for pass_index in range(passes)
        for begin in range(0, num_rows, micro_batch)
    ]
    updates = config.training.updates_per_step
    if len(units) % updates:
        raise ConfigError(
            f"training.updates_per_step={updates} does not divide the {len(units)} backward passes of a step "
            f"({passes} loss passes x micro-batches of {micro_batch} over {num_rows} training rows per process)"
        )
    per_update = len(units) // updates
    return [units[index : index + per_update] for index in range(0, len(units), per_update)]


def check_batches(config: TrainConfig, num_processes: int) -> tuple[Algorithm, int, int]:
    """Check that the global batch splits over ``num_processes`` and every step's backward units over
    ``updates_per_step``, without loading a model; returns the built algorithm, the images per process
    and the micro-batches per process.

    Row counts can follow a sliding window; the first ``num_steps`` steps cover every window position
    with stride and every 1 (each step checks its own units again as it runs).
    """
    local_images, micro_batches = config.per_process(num_processes)
    algorithm = build_algorithm(config)
    for step in range(1, config.sampler.num_steps + 1):
        update_units(
            config, algorithm.passes, local_images // micro_batches, algorithm.num_rows(local_images, step)
        )
    return algorithm, local_images, micro_batches
