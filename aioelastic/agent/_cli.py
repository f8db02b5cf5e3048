"""``aioelastic run``: torchrun's command line over :class:`~aioelastic.agent.ElasticAgent`.

Light to import: the agent, the rendezvous and the HTTP server are imported when the command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import uuid
from typing import Any

from ._launch import (
    LaunchPlan,
    build_entrypoint,
    make_plan,
    parse_nnodes,
    parse_nproc,
    rendezvous_parameters,
)
from ._torchrun_flags import UsageError, add_torchrun_flags, apply_env_defaults

__all__ = ["HELP", "build_entrypoint", "configure", "main", "parse_nnodes", "parse_nproc"]

HELP = "run an elastic job's workers on this node (torchrun's flags)"

log = logging.getLogger("aioelastic.agent")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``run`` flags (torchrun's names, both ``-`` and ``_`` spellings)."""
    parser.usage = "%(prog)s [options] [--] COMMAND [ARGS...]"
    _add_size_flags(parser)
    _add_rendezvous_flags(parser)
    _add_secret_flags(parser)
    _add_restart_flags(parser)
    _add_output_flags(parser)
    _add_node_flags(parser)
    _add_observability_flags(parser)
    _add_command_flags(parser)
    add_torchrun_flags(parser)
    apply_env_defaults(parser)  # last: every flag above reads PET_<NAME>, as torchrun's do
    parser.epilog = (
        "Every flag can also come from the environment as PET_<FLAG> (PET_NPROC_PER_NODE=8, "
        "PET_STANDALONE=1), as torchrun's; the command line wins."
    )
    parser.set_defaults(run_parser=parser)


def _add_size_flags(parser: argparse.ArgumentParser) -> None:
    """--standalone, the node count and the workers per node."""
    parser.add_argument(
        "--standalone",
        action="store_true",
        help="one node, no infrastructure: start an HTTP store on a free loopback port in this "
        "process and rendezvous there (implies --nnodes 1, a random --rdzv-id)",
    )
    parser.add_argument(
        "--nnodes",
        default="1:1",
        metavar="MIN:MAX",
        help="number of nodes, N or MIN:MAX (default: 1)",
    )
    parser.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc_per_node",
        default="1",
        metavar="N",
        help="workers per node: an integer, or 'cpu'/'auto' for the number of CPUs (default: 1)",
    )


def _add_rendezvous_flags(parser: argparse.ArgumentParser) -> None:
    """Where and how the nodes rendezvous."""
    parser.add_argument(
        "--rdzv-backend",
        "--rdzv_backend",
        dest="rdzv_backend",
        default=None,
        metavar="NAME",
        help="rendezvous backend: c10d/http (an 'aioelastic serve'), https, etcd, memory "
        "(single process), static (default: c10d; static, as torchrun, for a multi-node job "
        "without --rdzv-endpoint)",
    )
    parser.add_argument(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        dest="rdzv_endpoint",
        default="",
        metavar="URL",
        help="the rendezvous store: HOST[:PORT] (c10d/http, default port 29400), "
        "H1:2379,H2:2379 (etcd), or a store URL (http://HOST:PORT, https://..., etcd://...)",
    )
    parser.add_argument(
        "--rdzv-id",
        "--rdzv_id",
        dest="rdzv_id",
        default="none",
        metavar="ID",
        help="the job's run id",
    )
    parser.add_argument(
        "--rdzv-conf",
        "--rdzv_conf",
        dest="rdzv_conf",
        default="",
        metavar="K=V,...",
        help="rendezvous config: k=v,k2=v2 (join_timeout, last_call_timeout, close_timeout, "
        "keep_alive_interval, keep_alive_max_attempt, lease_ttl, node_id, ...)",
    )


def _add_secret_flags(parser: argparse.ArgumentParser) -> None:
    """The store's secrets: files, never argv."""
    parser.add_argument(
        "--token-file",
        "--token_file",
        dest="token_file",
        default=None,
        metavar="FILE",
        help="http(s)/c10d stores: the bearer token of the 'aioelastic serve', in FILE "
        "(default: $AIOELASTIC_TOKEN); never give a secret on the command line",
    )
    parser.add_argument(
        "--password-file",
        "--password_file",
        dest="password_file",
        default=None,
        metavar="FILE",
        help="etcd stores: the password of the user named in the endpoint (etcd://USER@host) "
        "or by --rdzv-conf username=USER, in FILE (default: $AIOELASTIC_ETCD_PASSWORD)",
    )
    parser.add_argument(
        "--worker-store-secrets",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="give the workers the path of the file holding the store's token or password "
        "(AIOELASTIC_TOKEN_FILE / AIOELASTIC_ETCD_PASSWORD_FILE), so that open_worker_store() "
        "can authenticate; the secret itself never goes to them (default: on)",
    )


def _add_restart_flags(parser: argparse.ArgumentParser) -> None:
    """How many restarts, and torchrun's (unused) monitor interval."""
    parser.add_argument(
        "--max-restarts",
        "--max_restarts",
        dest="max_restarts",
        type=int,
        metavar="K",
        default=0,
        help="restarts of the worker group after a failure before failing (default: 0)",
    )
    parser.add_argument(
        "--monitor-interval",
        "--monitor_interval",
        dest="monitor_interval",
        type=float,
        metavar="S",
        default=0.1,
        help="accepted for torchrun compatibility: the agent waits on worker exits and "
        "rendezvous events instead of polling, so failures are seen at once",
    )


def _add_output_flags(parser: argparse.ArgumentParser) -> None:
    """Where the workers' output goes."""
    parser.add_argument(
        "-r",
        "--redirects",
        default="0",
        metavar="STD",
        help="write worker streams to log files: 0 none, 1 stdout, 2 stderr, 3 both; or per "
        "local rank, e.g. 0:1,1:2",
    )
    parser.add_argument(
        "-t",
        "--tee",
        default="0",
        metavar="STD",
        help="like --redirects, but also copy the streams to the console with a [rankN]: prefix",
    )
    parser.add_argument(
        "--log-dir",
        "--log_dir",
        dest="log_dir",
        default=None,
        metavar="DIR",
        help="directory for the workers' log files (default: a temporary directory)",
    )


def _add_node_flags(parser: argparse.ArgumentParser) -> None:
    """This node's address, the workers' role, the stop and exit timeouts."""
    parser.add_argument(
        "--local-addr",
        "--local_addr",
        dest="local_addr",
        default=None,
        metavar="ADDR",
        help="this node's address as others see it (MASTER_ADDR when it is rank 0; default: "
        "its FQDN, 127.0.0.1 with --standalone)",
    )
    parser.add_argument("--role", default="default", help="the workers' role name")
    parser.add_argument(
        "--stop-timeout",
        "--stop_timeout",
        "--shutdown-timeout",
        "--shutdown_timeout",
        dest="stop_timeout",
        type=float,
        metavar="S",
        default=30.0,
        help="seconds between SIGTERM and SIGKILL when stopping workers (--shutdown-timeout "
        "is torchrun's name; default: $TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30)",
    )
    parser.add_argument(
        "--exit-barrier-timeout",
        dest="exit_barrier_timeout",
        type=float,
        metavar="S",
        default=300.0,
        help="seconds a node whose workers succeeded waits for the other nodes (default: 300)",
    )


def _add_observability_flags(parser: argparse.ArgumentParser) -> None:
    """Structured events and Prometheus metrics."""
    parser.add_argument(
        "--events",
        default=None,
        metavar="FILE",
        help="append structured events (rendezvous, timer reaps, worker failures and restarts) "
        "as JSON lines to FILE; '-' for stderr (default: $AIOELASTIC_EVENTS, else none)",
    )
    parser.add_argument(
        "--metrics-port",
        dest="metrics_port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics while running (default: off; "
        "needs prometheus-client, the 'server' extra)",
    )
    parser.add_argument(
        "--metrics-host",
        dest="metrics_host",
        default="127.0.0.1",
        metavar="HOST",
        help="the address --metrics-port binds (default: 127.0.0.1)",
    )


def _add_command_flags(parser: argparse.ArgumentParser) -> None:
    """What the workers run."""
    parser.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="COMMAND is a python module: run it with 'python -m'",
    )
    parser.add_argument(
        "--no-python",
        "--no_python",
        dest="no_python",
        action="store_true",
        help="run COMMAND as an executable (without it COMMAND runs with Python, whatever its "
        "name, as torchrun)",
    )
    parser.add_argument(
        "entrypoint",
        nargs=argparse.REMAINDER,
        metavar="COMMAND",
        help="a python script (run with this interpreter, whatever its name, as torchrun "
        "does), or with --no-python any executable, and its arguments",
    )


def _usage_error(args: argparse.Namespace, error: UsageError) -> int:
    """``run``'s usage line and the offending flag on stderr; exit code 2, as argparse."""
    parser: argparse.ArgumentParser | None = getattr(args, "run_parser", None)
    if parser is not None:
        parser.print_usage(sys.stderr)
    prog = parser.prog if parser is not None else "aioelastic run"
    print(f"{prog}: error: {error}", file=sys.stderr)
    return 2


def main(args: argparse.Namespace) -> int:
    """Run the agent until the job succeeds, fails or is interrupted; return its exit code."""
    # gRPC's fork handlers (an etcd store in this process) now and then crash a worker between
    # fork and exec with SIGSEGV while other threads are in gRPC (1-2 runs in 10 over etcd);
    # workers are exec'd programs and need none of them. Set before grpc is imported.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    logging.basicConfig(
        level=logging.INFO,
        format="[aioelastic run] %(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    from .._secrets import RedactingFilter, redact_url

    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
    try:
        plan = make_plan(args)
    except UsageError as exc:
        return _usage_error(args, exc)
    from .._secrets import read_secret_file
    from ..errors import StoreAuthError

    try:
        if args.token_file is not None:
            read_secret_file(args.token_file, "--token-file")
        if args.password_file is not None:
            read_secret_file(args.password_file, "--password-file")
    except ValueError as exc:
        print(f"aioelastic run: error: {redact_url(exc)}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(args, plan))
    except StoreAuthError as exc:
        print(
            f"aioelastic run: error: the store refused our credentials: {redact_url(exc)} (http: "
            "--token-file or $AIOELASTIC_TOKEN; etcd: --password-file or "
            "$AIOELASTIC_ETCD_PASSWORD)",
            file=sys.stderr,
        )
        return 1
    except Exception as exc:  # a clear one-line error, not a traceback
        print(f"aioelastic run: error: {type(exc).__name__}: {redact_url(exc)}", file=sys.stderr)
        return 1


def _no_metrics_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("prometheus-client is not installed")


async def _serve(plan: LaunchPlan) -> Any:
    """The store this node's agent serves: ``--standalone`` (a free loopback port) or node rank
    0 of the static backend (``--master-addr:--master-port``, as torchrun's rank 0 hosts its
    TCPStore there)."""
    from ..store.http.server import HttpStoreServer

    # this store's /metrics is nobody's concern here: --metrics-port is the agent's own
    logging.getLogger("aioelastic.serve").addFilter(_no_metrics_notice)
    host, port = plan.serve_store or ("127.0.0.1", 0)
    server = HttpStoreServer(host=host, port=port)
    await server.start()
    return server


def _worker_spec(args: argparse.Namespace, plan: LaunchPlan) -> Any:
    from . import WorkerSpec

    return WorkerSpec(
        entrypoint=plan.entrypoint,
        nproc_per_node=plan.nproc,
        max_restarts=args.max_restarts,
        role=args.role,
        log_dir=args.log_dir,
        redirects=args.redirects,
        tee=args.tee,
        stop_timeout=args.stop_timeout,
        exit_barrier_timeout=args.exit_barrier_timeout,
        monitor_interval=args.monitor_interval,
        local_ranks_filter=plan.local_ranks,
        virtual_local_rank=args.virtual_local_rank,
    )


async def _run(args: argparse.Namespace, plan: LaunchPlan) -> int:
    from ._secrets import RunSecrets

    spec = _worker_spec(args, plan)  # checked before anything starts
    server: Any = None
    opened: Any = None  # the --events file, closed at the end
    secrets = RunSecrets(args.token_file, args.password_file)
    endpoint, run_id, local_addr = plan.endpoint, plan.run_id, args.local_addr
    if plan.standalone or plan.serve_store is not None:
        server = await _serve(plan)
    if plan.standalone:
        endpoint, run_id = f"127.0.0.1:{server.port}", str(uuid.uuid4())
        local_addr = local_addr or "127.0.0.1"
        log.info("standalone: HTTP store at %s, run id %s", server.url, run_id)
    elif server is not None:
        log.info("static backend, node rank 0: serving the rendezvous store at %s", server.url)
    try:
        params = rendezvous_parameters(args, plan, endpoint, run_id, local_addr)
        _apply_secrets(params, secrets)
        from ..events import JsonLinesSink, default_sink, open_sink

        sink = open_sink(plan.events) if plan.events is not None else default_sink()
        if isinstance(sink, JsonLinesSink) and plan.events is not None:
            opened = sink
        return await _run_agent(args, plan, spec, params, sink)
    finally:
        secrets.close()
        if server is not None:
            await server.stop()
        if opened is not None:
            opened.close()


async def _run_agent(
    args: argparse.Namespace, plan: LaunchPlan, spec: Any, params: Any, sink: Any
) -> int:
    """Run the agent with the signals of ``--signals-to-handle`` stopping it; its exit code."""
    from . import ElasticAgent

    agent = ElasticAgent(
        spec,
        params,
        event_sink=sink,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        worker_store_secrets=args.worker_store_secrets,
    )
    loop = asyncio.get_running_loop()
    for sig in plan.signals:
        loop.add_signal_handler(sig, agent.request_stop, sig)
    try:
        log.info(
            "starting %d worker(s) per node, nodes %d:%d, max restarts %d: %s",
            plan.nproc,
            plan.min_nodes,
            plan.max_nodes,
            args.max_restarts,
            " ".join(plan.entrypoint),
        )
        result = await agent.run()
    finally:
        for sig in plan.signals:
            loop.remove_signal_handler(sig)
    level = logging.INFO if result.exit_code == 0 else logging.ERROR
    log.log(level, "%s", result.summary())
    return result.exit_code


def _apply_secrets(params: Any, secrets: Any) -> None:
    """Point the rendezvous at the store's secret files; no password left in its URL."""
    from ..rendezvous import store_url_for

    url = store_url_for(params)
    clean, conf = secrets.resolve(url)
    if clean != url:
        params.config["store_url"] = clean
    for key, value in conf.items():
        params.config.setdefault(key, value)
