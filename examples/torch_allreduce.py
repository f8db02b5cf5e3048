"""A ``torch.distributed`` all-reduce over gloo (CPU), launched by ``aioelastic run``.

``aioelastic run --standalone --nproc-per-node 2 examples/torch_allreduce.py`` (needs torch).
The agent sets ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE`` like torchrun, so the
``env://`` init method works unchanged.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")  # env:// from the agent's variables
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        tensor = torch.tensor([float(rank + 1)])
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        expected = world * (world + 1) / 2
        assert tensor.item() == expected, (tensor.item(), expected)
        print(
            f"rank {rank}/{world} (restart {os.environ['TORCHELASTIC_RESTART_COUNT']}): "
            f"all_reduce(sum of rank+1) = {tensor.item():g}",
            flush=True,
        )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
