"""``dynsched optimus serve|submit|status|cancel``: real jobs under the Optimus scheduler.

::

    dynsched optimus serve [--address ADDR] [--scheduler optimus+] [--interval 10] [--db F]
    dynsched optimus submit JOB.yaml [--db F]
    dynsched optimus status [--db F] [--json]
    dynsched optimus cancel NAME [--db F]

``serve`` starts a local Ray cluster (token authentication on) or joins ``--address`` and
runs the jobs of the job table ``--db`` (SQLite); the other commands only read or write
that table, so they run beside ``serve`` from any shell of the machine and never load Ray.
Errors are one line, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dynsched_optimus._cli_support import add_option, one_line_errors

__all__ = ["DEFAULT_DB", "add_subcommands"]

#: the job table used when ``--db`` is not given
DEFAULT_DB = ".dynsched/optimus.sqlite"


def _store(args: argparse.Namespace) -> Any:
    from dynsched_ray.optimus.store import JobStore

    return JobStore(args.db)


def _submit(args: argparse.Namespace) -> int:
    from dynsched_optimus.jobs import load_job_file

    spec = load_job_file(args.file)
    _store(args).submit(spec)
    print(f"submitted {spec.name!r} ({spec.workers} worker(s) requested) to {args.db}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from dynsched_ray.optimus.store import status_lines

    store = _store(args)
    if args.json:
        rows = [
            {
                "name": r.name,
                "state": r.state,
                "workers": 0 if r.placement is None else r.placement.workers,
                "batch": r.batch,
                "restarts": r.restarts,
                "remaining_steps": r.remaining,
                "last_report": store.last_report(r.name),
                "error": r.error,
            }
            for r in store.jobs()
        ]
        print(json.dumps(rows, indent=2))
    else:
        print("\n".join(status_lines(store)))
    return 0


def _cancel(args: argparse.Namespace) -> int:
    _store(args).request_cancel(args.name)
    print(f"cancel requested for {args.name!r} (the service stops it at its next round)")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import ray
    from dynsched_core.errors import UsageError
    from dynsched_optimus._errors import OptimusError
    from dynsched_optimus.jobs import make_decider

    from dynsched_ray.optimus.service import OptimusService, ServiceOptions
    from dynsched_ray.runtime.security import init_ray, plan_ray_start

    make_decider(args.scheduler)  # a bad name fails before Ray starts
    try:
        plan = plan_ray_start(args.address)
    except UsageError as exc:
        raise OptimusError(str(exc)) from None
    local = {} if args.num_cpus is None else {"num_cpus": args.num_cpus}
    try:
        init_ray(ray, plan, namespace="dynsched-optimus", prog="dynsched optimus serve", **local)
    except ConnectionError as exc:
        raise OptimusError(str(exc).splitlines()[0]) from None
    opts = ServiceOptions(
        scheduler=args.scheduler,
        interval_s=args.interval,
        restart_delay_s=args.restart_delay,
        checkpoint_root=args.checkpoints,
    )
    service = OptimusService(_store(args), opts, on_line=lambda s: print(s, file=sys.stderr))
    try:
        service.run(timeout_s=args.timeout, until_idle=args.until_idle)
    finally:
        service.shutdown()
    return 0


def _common(p: argparse.ArgumentParser, handler: Any) -> None:
    add_option(p, "--db", DEFAULT_DB, "the job table (SQLite file)")
    p.set_defaults(func=one_line_errors(handler))


def add_subcommands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve``, ``submit``, ``status`` and ``cancel`` to ``dynsched optimus``."""
    serve = sub.add_parser("serve", help="run submitted jobs on Ray under an Optimus scheduler")
    serve.add_argument("--address", default=None, help="Ray cluster to join (default: local)")
    add_option(serve, "--scheduler", "optimus+", "optimus+, optimus, fifo or drf")
    add_option(serve, "--interval", 10.0, "seconds between scheduling decisions", type=float)
    add_option(
        serve, "--restart-delay", 5.0, "re-allocation cost the policy assumes (s)", type=float
    )
    add_option(serve, "--checkpoints", "optimus-checkpoints", "checkpoint directory")
    serve.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local cluster")
    serve.add_argument("--timeout", type=float, default=None, help="stop serving after S seconds")
    serve.add_argument(
        "--until-idle", action="store_true", help="exit once every submitted job is done"
    )
    _common(serve, _serve)
    submit = sub.add_parser("submit", help="submit a job file (YAML/JSON/TOML)")
    submit.add_argument("file", help="the job file (see dynsched_optimus.jobs)")
    _common(submit, _submit)
    status = sub.add_parser("status", help="jobs, workers, progress, remaining steps and ETA")
    status.add_argument("--json", action="store_true", help="JSON output")
    _common(status, _status)
    cancel = sub.add_parser("cancel", help="cancel a job")
    cancel.add_argument("name", help="the job's name")
    _common(cancel, _cancel)
