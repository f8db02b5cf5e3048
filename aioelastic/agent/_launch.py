"""``aioelastic run``'s flags checked and resolved at the edge, before anything starts.

:func:`make_plan` turns the parsed flags into a :class:`LaunchPlan` or raises
:class:`~aioelastic.agent._torchrun_flags.UsageError` naming the flag and the expected form: the
command, the sizes, the rendezvous backend and its ``--rdzv-conf`` keys (parsed as creating the
handler would), torchrun's static backend and the ``--events`` file. Light to import.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._torchrun_flags import UsageError, parse_local_ranks, parse_signals, refuse_unsupported

if TYPE_CHECKING:
    from ..rendezvous import RendezvousParameters

__all__ = ["LaunchPlan", "build_entrypoint", "make_plan", "parse_nnodes", "parse_nproc"]

log = logging.getLogger("aioelastic.agent")

STATIC_PORT = 29500  # torchrun's --master-port default
# ConfigError keys that name a flag rather than an --rdzv-conf key
_KEY_FLAGS = {
    "rdzv_backend": "--rdzv-backend",
    "nnodes": "--nnodes",
    "endpoint": "--rdzv-endpoint",
    "run_id": "--rdzv-id",
}


@dataclass
class LaunchPlan:
    """What ``run`` will do, every value checked."""

    entrypoint: list[str]
    nproc: int
    min_nodes: int
    max_nodes: int
    backend: str
    endpoint: str
    run_id: str
    standalone: bool = False
    #: ``(host, port)`` of the store this node's agent serves (static, node rank 0)
    serve_store: tuple[str, int] | None = None
    signals: tuple[signal.Signals, ...] = ()
    local_ranks: frozenset[int] | None = None
    events: str | None = None
    extra_conf: dict[str, str] = field(default_factory=dict)


def parse_nnodes(text: str) -> tuple[int, int]:
    """``N`` or ``MIN:MAX`` -> (min, max); ``ValueError`` naming --nnodes otherwise."""
    min_text, sep, max_text = text.partition(":")
    try:
        low = int(min_text)
        high = int(max_text) if sep else low
    except ValueError:
        raise ValueError(f"--nnodes: {text!r} is not N or MIN:MAX") from None
    if low < 1 or high < low:
        raise ValueError(f"--nnodes: {text!r} needs 1 <= MIN <= MAX")
    return low, high


def _device_count(kind: str) -> int:
    """torchrun's ``gpu``/``xpu``/``auto``: the devices torch sees (``auto``: else the CPUs)."""
    try:
        import torch
    except ImportError:
        if kind == "auto":
            return os.cpu_count() or 1
        raise ValueError(
            f"--nproc-per-node: {kind!r} counts devices with torch, which is not installed; "
            "give a number"
        ) from None
    if kind == "auto":
        if torch.accelerator.is_available():
            return int(torch.accelerator.device_count())
        return os.cpu_count() or 1
    device = torch.cuda if kind == "gpu" else torch.xpu
    if not device.is_available():
        name = "cuda" if kind == "gpu" else "xpu"
        raise ValueError(
            f"--nproc-per-node: {kind!r} counts {name} devices, but torch.{name}.is_available() "
            "is False on this node; give a number, or 'cpu'"
        )
    return int(device.device_count())


def parse_nproc(text: str) -> int:
    """An integer >= 1; ``cpu`` (the CPUs), or as torchrun ``gpu``/``xpu`` (the devices torch
    sees) and ``auto`` (the accelerators, else the CPUs)."""
    if text == "cpu":
        return os.cpu_count() or 1
    if text in ("gpu", "xpu", "auto"):
        return _device_count(text)
    try:
        value = int(text)
    except ValueError:
        raise ValueError(
            f"--nproc-per-node: {text!r} is not an integer or cpu/gpu/xpu/auto"
        ) from None
    if value < 1:
        raise ValueError(f"--nproc-per-node must be >= 1, got {value}")
    return value


def build_entrypoint(args: argparse.Namespace) -> list[str]:
    """The worker argv, as torchrun builds it: COMMAND runs with this interpreter (``python -u``,
    or ``$PYTHON_EXEC``) whatever its name, ``-m`` runs a module; ``--no-python`` runs it as an
    executable; ``--run-path`` runs the file with Python (over ``-m`` and ``--no-python``)."""
    command = list(args.entrypoint)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValueError("give the COMMAND to run, e.g. 'aioelastic run -- train.py --epochs 3'")
    python = os.environ.get("PYTHON_EXEC") or sys.executable
    if getattr(args, "run_path", False):
        return [python, "-u", *command]
    if args.no_python:
        if args.module:
            raise ValueError("--no-python and --module cannot be used together: -m runs Python")
        return command
    if args.module:
        return [python, "-u", "-m", *command]
    return [python, "-u", *command]


def _flag_values(args: argparse.Namespace) -> None:
    """Numbers argparse typed but did not range-check."""
    for flag, dest in (
        ("--max-restarts", "max_restarts"),
        ("--stop-timeout", "stop_timeout"),
        ("--exit-barrier-timeout", "exit_barrier_timeout"),
        ("--monitor-interval", "monitor_interval"),
    ):
        value = getattr(args, dest)
        if value < 0:
            raise UsageError(flag, f"must be >= 0, got {value}")
    port = args.metrics_port
    if port is not None:
        if not 0 <= port <= 65535:
            raise UsageError("--metrics-port", f"must be 0-65535, got {port}")
        from ._metrics import require_prometheus

        try:
            require_prometheus("--metrics-port")
        except ImportError as exc:
            raise UsageError("--metrics-port", str(exc)) from None


def _events(args: argparse.Namespace) -> str | None:
    """The ``--events`` destination, opened once now so that a bad path fails at start."""
    spec: str | None = args.events
    if spec is None and args.event_log_handler == "console":
        spec = "-"
    if spec is None or spec.strip() in ("", "-", "stderr", "stdout"):
        return spec
    try:
        fd = os.open(spec, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise UsageError("--events", f"cannot write to {spec!r}: {exc.strerror}") from None
    os.close(fd)
    return spec


def make_plan(args: argparse.Namespace) -> LaunchPlan:
    """Check every flag and resolve the rendezvous; :class:`UsageError` on the first bad one."""
    refuse_unsupported(args)
    try:
        entrypoint = build_entrypoint(args)
    except ValueError as exc:
        raise UsageError("COMMAND", str(exc)) from None
    try:
        nproc = parse_nproc(str(args.nproc_per_node))
        min_nodes, max_nodes = parse_nnodes(str(args.nnodes))
    except ValueError as exc:
        flag, _, message = str(exc).partition(": ")
        raise UsageError(flag.split()[0], message or str(exc)) from None
    _flag_values(args)
    if args.rdzv_backend is not None:
        _known_backend(args.rdzv_backend)
    plan = LaunchPlan(
        entrypoint,
        nproc,
        min_nodes,
        max_nodes,
        backend=args.rdzv_backend or "c10d",
        endpoint=args.rdzv_endpoint,
        run_id=args.rdzv_id,
        signals=parse_signals(args.signals_to_handle),
        local_ranks=parse_local_ranks(args.local_ranks_filter, nproc),
        events=_events(args),
    )
    _resolve_rendezvous(args, plan)
    check_rendezvous(args, plan)
    return plan


def _known_backend(name: str) -> None:
    from ..rendezvous import handler_registry, register_builtin_backends

    register_builtin_backends()
    names = handler_registry.backends()
    if name not in names:
        raise UsageError(
            "--rdzv-backend", f"{name!r} is not a rendezvous backend; use one of {', '.join(names)}"
        )


def _resolve_rendezvous(args: argparse.Namespace, plan: LaunchPlan) -> None:
    """torchrun's choice: one node and no endpoint runs standalone; several nodes and no
    endpoint use the static backend at ``--master-addr:--master-port``."""
    backend, standalone = args.rdzv_backend, bool(args.standalone)
    if standalone and plan.max_nodes > 1:
        raise UsageError(
            "--standalone",
            f"runs one node on its own store, but --nnodes is {args.nnodes}; for several nodes "
            "give --rdzv-endpoint (an 'aioelastic serve') instead",
        )
    no_endpoint = not plan.endpoint and backend != "memory"
    if not standalone and no_endpoint and backend in (None, "static"):
        if plan.max_nodes == 1 and args.master_port is None:
            standalone = True  # torchrun runs one node without any endpoint too
        else:
            plan.backend = "static"
            if plan.min_nodes != plan.max_nodes:
                raise UsageError(
                    "--rdzv-endpoint",
                    f"--nnodes {args.nnodes} is elastic, which needs a store: give "
                    "--rdzv-endpoint (an 'aioelastic serve', or etcd), or --standalone for one "
                    "node; the static backend (--node-rank/--master-addr) needs a fixed --nnodes N",
                )
            host = args.master_addr or "127.0.0.1"
            port = args.master_port if args.master_port is not None else STATIC_PORT
            plan.endpoint = f"{host}:{port}"
            plan.extra_conf["master_addr"] = host
            if args.node_rank == 0:
                plan.serve_store = (host.strip("[]"), port)
    elif not standalone and no_endpoint:
        if plan.max_nodes > 1:
            raise UsageError("--rdzv-endpoint", "give it (or --standalone for one node)")
        standalone = True
    if standalone:
        if plan.endpoint:
            log.warning("--standalone runs one node on its own store: ignoring --rdzv-endpoint")
        plan.standalone = True
        plan.backend, plan.endpoint = "c10d", "127.0.0.1:1"  # the port is chosen at start
    if plan.backend == "static":
        plan.extra_conf["rank"] = str(args.node_rank)
        if args.master_addr is not None:
            plan.extra_conf["master_addr"] = args.master_addr
    else:
        if args.node_rank != 0:
            log.warning("--node-rank is only used by the static backend: ignored")
        if args.master_addr is not None or args.master_port is not None:
            log.warning("--master-addr/--master-port are only used by the static backend: ignored")


def rendezvous_parameters(
    args: argparse.Namespace, plan: LaunchPlan, endpoint: str, run_id: str, local_addr: str | None
) -> RendezvousParameters:
    """The handler's parameters (``--rdzv-conf`` keys win over those the flags imply)."""
    from ..rendezvous import RendezvousParameters

    store_url = ""
    if "://" in endpoint:  # a store URL rather than host:port
        store_url, endpoint = endpoint, ""
    params = RendezvousParameters.from_rdzv_conf(
        plan.backend,
        endpoint,
        run_id,
        plan.min_nodes,
        plan.max_nodes,
        rdzv_conf=args.rdzv_conf,
        local_addr=local_addr,
    )
    if store_url:
        params.config.setdefault("store_url", store_url)
    for key, value in plan.extra_conf.items():
        params.config.setdefault(key, value)
    if plan.standalone:
        params.config.setdefault("last_call_timeout", 0)
    return params


def check_rendezvous(args: argparse.Namespace, plan: LaunchPlan) -> None:
    """Parse the rendezvous parameters as creating the handler will, without opening a store."""
    from ..errors import ConfigError
    from ..rendezvous import check_params

    run_id = "standalone" if plan.standalone else plan.run_id
    try:
        check_params(rendezvous_parameters(args, plan, plan.endpoint, run_id, args.local_addr))
    except ConfigError as exc:
        flag = _KEY_FLAGS.get(exc.key, "--rdzv-conf")
        if exc.key in plan.extra_conf and f"{exc.key}=" not in args.rdzv_conf:
            flag = {"rank": "--node-rank", "master_addr": "--master-addr"}.get(exc.key, flag)
        if flag == "--rdzv-conf" and exc.key != "rdzv_conf":
            raise UsageError(flag, f"{exc.key}={exc.value}: expected {exc.expected}") from None
        raise UsageError(flag, f"{exc.value!r}: expected {exc.expected}") from None
    except ValueError as exc:
        raise UsageError("--rdzv-conf", str(exc)) from None
