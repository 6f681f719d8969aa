"""Data-parallel training across processes (torchrun, gloo on CPU): more learner machines, not more code.

Under `torchrun --nproc_per_node P` (or several nodes), every process holds the same model; each step all
of them draw the same global batch from the same seeded sampler and each trains on its slice
(rows rank, rank + P, ...), and DistributedDataParallel averages the gradients. So a P-process run sees
exactly the batches a single process with the same `batch_size` sees, and its checkpoints (written by
rank 0 only) resume on any number of processes. The RL stages (offline RL, PPO, semi-online RL through PPO) slice
the same way and average their gradients with `average_gradients` (their losses take several forwards, which DDP
does not allow before one backward); a decision such as PPO's early stop is taken on the mean over the processes.
Outside torchrun everything here is a no-op.
"""

from __future__ import annotations

import os

import numpy as np
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
    _init()
    # find_unused_parameters: a batch without clicks leaves the pointer head without gradient.
    return torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)


def local_slice(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This process's rows of a global batch (every tensor's first axis)."""
    rank, size = world()
    return batch if size == 1 else {name: value[rank::size] for name, value in batch.items()}


def barrier() -> None:
    """Wait for every process (no-op outside torchrun)."""
    if world()[1] > 1:
        _init()
        dist.barrier()


def local_rows(rows: np.ndarray) -> np.ndarray:
    """This process's share of a global selection of rows (rank, rank + P, ...): the RL stages slice the row
    indices before building a batch, so each process encodes only its own screens."""
    rank, size = world()
    return rows if size == 1 else rows[rank::size]


def average_gradients(params: list[torch.nn.Parameter]) -> None:
    """Average the gradients of `params` over the processes, in one all-reduce: DDP's averaging, for the RL losses
    that run several forwards (policy, reference, demonstrations) before one backward. A parameter without a
    gradient on some process counts as zeros, so every process reduces the same tensor. No-op outside torchrun."""
    _, size = world()
    if size == 1:
        return
    _init()
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= size
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def mean_over_processes(value: float) -> float:
    """`value` averaged over the processes (a loss to report, a KL that decides an early stop on every process
    alike); `value` itself outside torchrun."""
    _, size = world()
    if size == 1:
        return value
    _init()
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor)
    return float(tensor.item()) / size


def _init() -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo")


def share(local_count: float | torch.Tensor) -> float:
    """Weight that turns a mean over this process's `local_count` items (tokens, rows, pairs) into its part of the
    mean over every process's items: local_count * P / global_count. The RL losses are masked means whose counts
    differ between slices (a slice's acted tokens, its rows with a click target); weighted by it, the averaged
    gradient is the single-process gradient. 1 outside torchrun."""
    _, size = world()
    local = float(local_count)
    if size == 1:
        return 1.0
    _init()
    total = torch.tensor([local], dtype=torch.float64)
    dist.all_reduce(total)
    return local * size / float(total.item()) if total.item() > 0 else 0.0
