"""torchrun's remaining flags for ``aioelastic run``, and torchrun's ``PET_*`` environment.

Each flag either has torchrun's meaning or is refused with a usage error that says why and what
to use instead; nothing is accepted and silently ignored except ``--start-method`` and
``--monitor-interval``, which have no effect for a script in torchrun either. Light to import.
"""

from __future__ import annotations

import argparse
import os
import signal
from dataclasses import dataclass

__all__ = [
    "UsageError",
    "add_torchrun_flags",
    "apply_env_defaults",
    "parse_local_ranks",
    "parse_signals",
    "refuse_unsupported",
]

# torchrun's choices (torch.numa.binding._AffinityMode): listed so that a valid torchrun value
# gets the "why not" message below, not argparse's "invalid choice"
_NUMA_MODES = ("node", "socket", "exclusive", "core-complex")
_TRUE = ("1", "true", "yes", "y", "t")
_FALSE = ("0", "false", "no", "n", "f", "")


@dataclass(frozen=True)
class UsageError(Exception):
    """A command-line value that cannot be used; ``flag`` names it, ``message`` says why."""

    flag: str
    message: str

    def __str__(self) -> str:
        return f"{self.flag}: {self.message}"


def _comma_list(value: str) -> list[str]:
    """torchrun's form: ``a,b``; ``,,`` is an escaped comma."""
    placeholder = "\0"
    return [item.replace(placeholder, ",") for item in value.replace(",,", placeholder).split(",")]


def add_torchrun_flags(parser: argparse.ArgumentParser) -> None:
    """The torchrun flags beyond the core ones: the static backend, output and signal options."""
    group = parser.add_argument_group("torchrun compatibility")
    _add_static_flags(group)
    _add_launch_flags(group)
    _add_refused_flags(group)


def _add_static_flags(group: argparse._ArgumentGroup) -> None:
    """torchrun's static backend: this node's rank, node rank 0's store address."""
    group.add_argument(
        "--node-rank",
        "--node_rank",
        dest="node_rank",
        type=int,
        default=0,
        metavar="N",
        help="this node's rank for --rdzv-backend static (default: 0)",
    )
    group.add_argument(
        "--master-addr",
        "--master_addr",
        dest="master_addr",
        default=None,
        metavar="HOST",
        help="static backend without --rdzv-endpoint: node rank 0's address; its agent serves "
        "the rendezvous store at MASTER_ADDR:MASTER_PORT (default: 127.0.0.1)",
    )
    group.add_argument(
        "--master-port",
        "--master_port",
        dest="master_port",
        type=int,
        default=None,
        metavar="PORT",
        help="static backend without --rdzv-endpoint: the port of that store (default: 29500)",
    )


def _add_launch_flags(group: argparse._ArgumentGroup) -> None:
    """How the workers start and are shown, which signals stop them, the event log."""
    group.add_argument(
        "--start-method",
        "--start_method",
        dest="start_method",
        default="spawn",
        choices=["spawn", "fork", "forkserver"],
        help="accepted for torchrun compatibility: COMMAND always runs as a new process, as "
        "torchrun runs a script whatever the start method",
    )
    group.add_argument(
        "--run-path",
        "--run_path",
        dest="run_path",
        action="store_true",
        help="COMMAND is a Python file (any name): run it with this interpreter, as runpy would",
    )
    group.add_argument(
        "--local-ranks-filter",
        "--local_ranks_filter",
        dest="local_ranks_filter",
        default="",
        metavar="R,...",
        help="show only these local ranks' output on the console (e.g. 0,1); the others' "
        "--redirects/--tee files are still written",
    )
    group.add_argument(
        "--signals-to-handle",
        "--signals_to_handle",
        dest="signals_to_handle",
        default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        metavar="SIG,...",
        help="signals that stop the job: each is forwarded to the workers, SIGKILL follows after "
        "--stop-timeout (default: SIGTERM,SIGINT,SIGHUP,SIGQUIT)",
    )
    group.add_argument(
        "--virtual-local-rank",
        "--virtual_local_rank",
        dest="virtual_local_rank",
        action="store_true",
        help="LOCAL_RANK=0 in every worker, and CUDA_VISIBLE_DEVICES set to the worker's GPU",
    )
    group.add_argument(
        "--event-log-handler",
        "--event_log_handler",
        dest="event_log_handler",
        default="null",
        metavar="NAME",
        help="'null' (default) or 'console' (structured events to stderr, as --events -); use "
        "--events FILE for a file",
    )


def _add_refused_flags(group: argparse._ArgumentGroup) -> None:
    """torchrun's flags for torch plugins and bindings: refused, each saying why."""
    group.add_argument(
        "--logs-specs",
        "--logs_specs",
        dest="logs_specs",
        default=None,
        metavar="NAME",
        help="not supported (a torch LogsSpecs plugin): use --log-dir, --redirects, --tee",
    )
    group.add_argument(
        "--numa-binding",
        "--numa_binding",
        dest="numa_binding",
        default=None,
        choices=_NUMA_MODES,
        help="not supported: bind in COMMAND, e.g. --no-python -- numactl --cpunodebind=0 python "
        "train.py",
    )
    for stream in ("stdout", "stderr"):
        group.add_argument(
            f"--duplicate-{stream}-filters",
            f"--duplicate_{stream}_filters",
            dest=f"duplicate_{stream}_filters",
            type=_comma_list,
            default=[],
            metavar="TEXT,...",
            help=f"not supported: keep {stream} with --tee and --log-dir and filter the files",
        )


def _env_flag(name: str, value: str) -> bool | str:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    return f"{name}={value!r} is not 0 or 1"


def _env_value_problem(action: argparse.Action, value: str) -> str | None:
    """Why ``value`` does not suit ``action`` (argparse checks neither type nor choices of a
    default as helpfully), or None."""
    flag = action.option_strings[-1 if len(action.option_strings) == 1 else 0]
    if callable(action.type):
        try:
            converted = action.type(value)
        except (TypeError, ValueError):
            kind = getattr(action.type, "__name__", "value")
            return f"{flag} takes a {kind}"
    else:
        converted = value
    if action.choices is not None and converted not in action.choices:
        return f"{flag} takes one of {', '.join(map(str, action.choices))}"
    return None


def apply_env_defaults(parser: argparse.ArgumentParser) -> None:
    """Take every flag's default from ``PET_<DEST>`` as torchrun does (``PET_NNODES=2``...).

    A command-line flag still wins. ``--stop-timeout`` also reads ``PET_SHUTDOWN_TIMEOUT`` and
    ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` (in that order). Malformed values are reported by
    :func:`refuse_unsupported` as usage errors naming the variable.
    """
    errors: list[str] = []
    for action in parser._actions:  # argparse has no public list of a parser's actions
        if not action.option_strings or action.dest in ("help", "version"):
            continue
        names = [f"PET_{action.dest.upper()}"]
        if action.dest == "stop_timeout":
            names += ["PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]
        name = next((n for n in names if os.environ.get(n)), None)
        if name is None:
            continue
        value = os.environ[name]
        if action.nargs == 0:  # a store_true flag: torchrun's check_env
            flag = _env_flag(name, value)
            if isinstance(flag, str):
                errors.append(flag)
            else:
                action.default = flag
        elif (problem := _env_value_problem(action, value)) is not None:
            errors.append(f"{name}={value!r}: {problem}")
        else:
            action.default = value  # a str default goes through the flag's type, as argv does
    parser.set_defaults(env_errors=errors)


def parse_local_ranks(text: str, nproc: int) -> frozenset[int] | None:
    """``--local-ranks-filter``: ``0,1`` -> {0, 1}; empty -> None (every rank)."""
    if not text.strip():
        return None
    try:
        ranks = frozenset(int(part) for part in text.split(","))
    except ValueError:
        raise UsageError(
            "--local-ranks-filter", f"{text!r} is not a comma-separated list of integers"
        ) from None
    bad = sorted(r for r in ranks if not 0 <= r < nproc)
    if bad:
        raise UsageError("--local-ranks-filter", f"local ranks {bad} are not in 0..{nproc - 1}")
    return ranks


def parse_signals(text: str) -> tuple[signal.Signals, ...]:
    """``--signals-to-handle``: ``SIGTERM,SIGUSR1`` -> the signals (names, with or without SIG)."""
    found: list[signal.Signals] = []
    for part in text.split(","):
        name = part.strip().upper()
        if not name:
            continue
        if not name.startswith("SIG"):
            name = "SIG" + name
        sig = getattr(signal.Signals, name, None)
        if sig is None or sig in (signal.SIGKILL, signal.SIGSTOP):
            raise UsageError(
                "--signals-to-handle", f"{part.strip()!r} is not a signal the agent can handle"
            )
        found.append(sig)
    if not found:
        raise UsageError("--signals-to-handle", "give at least one signal, e.g. SIGTERM,SIGINT")
    return tuple(dict.fromkeys(found))


def refuse_unsupported(args: argparse.Namespace) -> None:
    """Raise :class:`UsageError` for a torchrun flag that has no meaning here, saying why."""
    env_errors = getattr(args, "env_errors", [])
    if env_errors:
        raise UsageError("environment", "; ".join(env_errors))
    if args.logs_specs is not None:
        raise UsageError(
            "--logs-specs",
            "torch's LogsSpecs plugins are not loaded; --log-dir, --redirects and --tee choose "
            "where worker output goes",
        )
    if args.numa_binding is not None:
        raise UsageError(
            "--numa-binding",
            "NUMA binding needs torch's GPU affinity code; bind in COMMAND instead, e.g. "
            "'aioelastic run --no-python -- numactl --cpunodebind=0 python train.py'",
        )
    for stream in ("stdout", "stderr"):
        if any(getattr(args, f"duplicate_{stream}_filters")):
            raise UsageError(
                f"--duplicate-{stream}-filters",
                f"not supported; keep {stream} in files with --tee and --log-dir and filter "
                "those (grep)",
            )
    if args.event_log_handler not in ("null", "console"):
        raise UsageError(
            "--event-log-handler",
            f"{args.event_log_handler!r} is a torch events handler; aioelastic writes its "
            "structured events with --events FILE ('null' and 'console' are accepted)",
        )
    if args.no_python and (args.module or args.run_path):
        flag = "--module" if args.module else "--run-path"
        raise UsageError("--no-python", f"cannot be used with {flag}: both run Python")
    if args.master_port is not None and not 0 < args.master_port < 65536:
        raise UsageError("--master-port", f"{args.master_port} is not a port in 1..65535")
    if args.node_rank < 0:
        raise UsageError("--node-rank", f"{args.node_rank} is not a rank >= 0")
