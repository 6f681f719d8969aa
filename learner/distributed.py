"""Data-parallel training across processes (torchrun, gloo on CPU): more learner machines, not more code.

Under `torchrun --nproc_per_node P` (or several nodes), every process holds the same model; each step all
of them draw the same global batch from the same seeded sampler and each trains on its slice
(rows rank, rank + P, ...), and DistributedDataParallel averages the gradients. So a P-process run sees
exactly the batches a single process with the same `batch_size` sees, and its checkpoints (written by
rank 0 only) resume on any number of processes. Outside torchrun everything here is a no-op.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def world() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) outside torchrun."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def is_main() -> bool:
    return world()[0] == 0


def wrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module to run forward/backward through: DDP over gloo under torchrun, else the model itself."""
    _, size = world()
    if size == 1:
        return model
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    # find_unused_parameters: a batch without clicks leaves the pointer head without gradient.
    return torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)


def local_slice(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This process's rows of a global batch (every tensor's first axis)."""
    rank, size = world()
    return batch if size == 1 else {name: value[rank::size] for name, value in batch.items()}


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
