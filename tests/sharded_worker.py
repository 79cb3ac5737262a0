"""Run by ``torchrun --nproc_per_node 2`` in ``test_sharding.py``: two optimizer steps of flow matching on the
tiny shapes model, wrapped in DDP or sharded with FSDP2 (``fully_shard`` per block, then the root) over
gloo, from the same initial weights and the same global batch; rank 0 saves the full parameters after."""

import os
import sys

import torch
import torch.distributed as dist
from conftest import tiny_config
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from flowrl.models.shapes_dit import ShapesDiT

GLOBAL_BATCH = 8
PROMPTS = ["a red circle", "two blue squares", "a green triangle left of a circle", "three circles"]


def main(mode: str, output: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = ShapesDiT(tiny_config())
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    initial = {key: value.clone() for key, value in model.state_dict().items()}
    if mode == "fsdp":
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        network = model
    else:
        network = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    local = GLOBAL_BATCH // world
    for step in range(2):
        generator = torch.Generator().manual_seed(step)
        x0 = torch.randn(GLOBAL_BATCH, 3, 32, 32, generator=generator)[rank * local : (rank + 1) * local]
        noise = torch.randn(GLOBAL_BATCH, 3, 32, 32, generator=generator)[rank * local : (rank + 1) * local]
        t = torch.rand(GLOBAL_BATCH, generator=generator)[rank * local : (rank + 1) * local]
        prompts = [PROMPTS[(rank * local + i) % len(PROMPTS)] for i in range(local)]
        ids, mask = model.encode_prompts(prompts)
        x_t = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * noise
        loss = (network(x_t, t, ids, mask) - (noise - x0)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    state = model.state_dict()
    full = {
        key: value.full_tensor() if hasattr(value, "full_tensor") else value for key, value in state.items()
    }
    sharded = sum(type(p).__name__ == "DTensor" for p in model.parameters())
    if rank == 0:
        torch.save({"initial": initial, "parameters": full, "sharded_parameters": sharded}, output)
    dist.barrier()  # both ranks leave together: gloo aborts a process torn down while its peer still talks
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    # Skip the interpreter's teardown: gloo's threads can abort a process there ("terminate called
    # without an active exception", about 1 run in 12 here), after all the work is done and saved.
    sys.stdout.flush()
    os._exit(0)
