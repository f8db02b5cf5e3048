"""What an :class:`~aioelastic.agent.ElasticAgent` runs on its node and how: :class:`WorkerSpec`,
every value checked when it is made."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ._workers import parse_std

__all__ = ["WorkerSpec"]


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What to run on this node and how (torch's ``WorkerSpec`` plus the launcher's options).

    ``entrypoint`` is the full argv of a worker. ``redirects``/``tee`` take torchrun's forms
    (``3``, ``"0:1,1:2"``); log files go under ``log_dir`` (a temporary directory when output is
    redirected and no ``log_dir`` is given). ``stop_timeout`` is the grace between SIGTERM and
    SIGKILL when the agent stops its workers; ``exit_barrier_timeout`` how long a node whose
    workers all succeeded waits for the other nodes' workers before leaving.
    ``rendezvous_retry_timeout``: how long the agent keeps rejoining after the store was
    unreachable (``RendezvousConnectionError``: an etcd leader election, a restarted store
    server) before it gives up; 0 gives up at the first such error.
    ``loss_window``: a worker failure that comes with the loss of a node is that change's
    consequence (the survivors' workers fail on the broken collective), not a failure of the job:
    with no restart left, a failed node waits this long for a membership change before it fails
    (only when the round has other nodes; ``None``: the rendezvous lease's TTL + 1 s, by which a
    dead node's lease has expired); with restarts left, it restarts at once and the restart is
    not counted when the next round shows a node of the last one lost.
    ``local_ranks_filter`` (torchrun's ``--local-ranks-filter``): only these local ranks' output
    reaches the console (the others' log files are still written). ``virtual_local_rank``:
    ``LOCAL_RANK=0`` in every worker and ``CUDA_VISIBLE_DEVICES`` its one GPU, as torchrun's.
    """

    entrypoint: Sequence[str]
    nproc_per_node: int = 1
    max_restarts: int = 0
    role: str = "default"
    env: Mapping[str, str] = field(default_factory=dict)
    log_dir: str | None = None
    redirects: str | int = 0
    tee: str | int = 0
    stop_timeout: float = 30.0
    exit_barrier_timeout: float = 300.0
    monitor_interval: float = 0.1
    rendezvous_retry_timeout: float = 60.0
    loss_window: float | None = None
    local_ranks_filter: frozenset[int] | None = None
    virtual_local_rank: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.entrypoint, str) or not self.entrypoint:
            raise ValueError("entrypoint must be a non-empty sequence of argv strings")
        if not all(isinstance(a, str) for a in self.entrypoint):
            raise TypeError("entrypoint must hold only str")
        for name in ("nproc_per_node", "max_restarts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be >= 1, got {self.nproc_per_node}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        for name in (
            "stop_timeout",
            "exit_barrier_timeout",
            "monitor_interval",
            "rendezvous_retry_timeout",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
        window = self.loss_window
        if window is not None and (
            isinstance(window, bool) or not isinstance(window, (int, float)) or window < 0
        ):
            raise ValueError(f"loss_window must be a number of seconds >= 0, got {window!r}")
        parse_std(self.redirects, self.nproc_per_node, "redirects")
        parse_std(self.tee, self.nproc_per_node, "tee")
        if self.local_ranks_filter is not None and not all(
            isinstance(r, int) and 0 <= r < self.nproc_per_node for r in self.local_ranks_filter
        ):
            raise ValueError(f"local_ranks_filter: {self.local_ranks_filter!r} are not local ranks")
