"""One participant of ``benchmarks/rdzv_processes.py``: ``python -m benchmarks._rdzv_node BACKEND
ENDPOINT RUN_ID N [LOG]``.

It creates its handler through torch's registry (min = max = N), says ``ready``, then joins one
round per t0 read from stdin (an empty line ends it) and prints each join's figures as JSON.

It runs from this file, as torchrun's agent runs from its own script, not as ``python -c``:
torch's handler calls ``inspect.stack()`` for every event it records (``get_method_name()`` in
``dynamic_rendezvous._record``, evaluated whatever the log level), and ``inspect.getmodule()``
cannot map a ``<string>`` frame to a module, so it walks all of ``sys.modules`` (about 1,200 with
torch) for every such frame: 29 ms of CPU per recorded event here instead of 0.45 ms, which
starved torch's compare-and-set loop and keep-alives at N=64 (docs/benchmarks.md).

``LOG``, a file path: torch's ``torch.distributed.elastic`` logger at DEBUG into it (diagnosis
only; its formatting costs CPU too).
"""

from __future__ import annotations

import json
import logging
import sys
import time

from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler


def main(argv: list[str]) -> None:
    backend, endpoint, run_id, n = argv[0], argv[1], argv[2], int(argv[3])
    if len(argv) > 4:
        handler_ = logging.FileHandler(argv[4])
        handler_.setFormatter(logging.Formatter("%(created).6f %(process)d %(message)s"))
        log = logging.getLogger("torch.distributed.elastic")
        log.setLevel(logging.DEBUG)
        log.addHandler(handler_)
        log.propagate = False  # not torch's stderr handler as well
    if backend == "aioelastic":
        from aioelastic.torchrun import register

        register()
    # torch's default join timeout, 600 s (as torchrun leaves it)
    params = RendezvousParameters(backend, endpoint, run_id, n, n, join_timeout="600")
    handler = get_rendezvous_handler(params)
    print("ready", flush=True)
    while line := sys.stdin.readline().strip():  # a t0 per round; an empty line: the end
        time.sleep(max(0.0, float(line) - time.time()))
        cpu = time.process_time()
        info = handler.next_rendezvous()
        done = time.time()
        cpu = time.process_time() - cpu
        figures = {"done": done, "cpu": cpu, "rank": info.rank, "world": info.world_size}
        print(json.dumps(figures), flush=True)
    if backend == "aioelastic":
        handler.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
