"""``python manage.py runworker``: run the job loop until drained or stopped."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connection, connections

from jobs import registry
from jobs.checks import fence_ttl_problems
from jobs.primitives import ceilings
from jobs.runner.supervisor import Supervisor
from jobs.runner.worker import HEARTBEAT_SECONDS, LEASE_BEATS, LEASE_MARGIN_SECONDS, Worker, default_worker_id
from jobs.storage.migration_check import migration_problems
from vpay import db_role
from vpay.db_errors import unavailable_message
from vpay.errors import error_chain


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError
    return value


class Command(BaseCommand):
    help = (
        "Run the vpay job worker: claim jobs, run their handlers, settle them. "
        "SIGTERM/SIGINT drains (grace clock starts at the signal); a second signal exits at once."
    )

    def add_arguments(self, parser):
        # Defaults are None so that jobs.primitives.ceilings can say where each value came from
        # (flag, env var, default); it resolves them.
        parser.add_argument(
            "--concurrency",
            type=int,
            default=None,
            help="Executor threads, each running one job at a time on its own database connection; "
            "the worker claims only what they can start now (default 4; VPAY_WORKER_CONCURRENCY).",
        )
        parser.add_argument(
            "--processes",
            type=int,
            default=None,
            help="Worker processes, each with --concurrency executors, forked after setup and supervised: "
            "a dead one's jobs are rescued at once and it is replaced (default: the cores this process may "
            "run on; 1 makes this process the worker; VPAY_WORKER_PROCESSES). See docs/runner.md, 'Processes'.",
        )
        parser.add_argument(
            "--queues",
            default=None,
            help="Comma-separated queues to claim from (default: default; VPAY_WORKER_QUEUES).",
        )
        parser.add_argument(
            "--heartbeat",
            type=float,
            default=None,
            metavar="SECONDS",
            help=f"How often the worker beats, extending every lease it holds to two beats plus 2 s "
            f"(default {HEARTBEAT_SECONDS:g}; VPAY_WORKER_HEARTBEAT_SECONDS). A dead worker's jobs are "
            "rescued about two beats after its last one, whatever their kinds' timeouts.",
        )
        parser.add_argument(
            "--grace",
            type=float,
            default=None,
            metavar="SECONDS",
            help="On SIGTERM, how long in-flight jobs may take to finish (default 30; VPAY_WORKER_GRACE_SECONDS).",
        )
        parser.add_argument("--burst", action="store_true", help="Drain what is claimable now, then exit 0.")
        parser.add_argument(
            "--metrics-port", type=int, default=None, help="Serve Prometheus metrics on this port (default: off)."
        )
        parser.add_argument(
            "--metrics-addr",
            default=os.environ.get("VPAY_METRICS_ADDR", "127.0.0.1"),
            help="Address the metrics server binds (default 127.0.0.1; VPAY_METRICS_ADDR).",
        )
        parser.add_argument(
            "--print-config",
            action="store_true",
            help="Print every ceiling the worker would run under (value and source), then exit 0 without starting.",
        )
        parser.add_argument(
            "--format",
            choices=("table", "json"),
            default="table",
            help="--print-config's output: an aligned table (default) or JSON.",
        )
        parser.add_argument(
            "--worker-id", default=None, help="Name in locked_by and pg_stat_activity (default host:pid:random)."
        )

    def handle(self, *args, **opts):
        try:
            options = ceilings.worker_options(opts)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        opts.update(options.values)
        queues = [q.strip() for q in opts["queues"].split(",") if q.strip()]
        if opts["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        if opts["processes"] < 1:
            raise CommandError("--processes must be at least 1")
        if opts["heartbeat"] <= 0:
            raise CommandError("--heartbeat must be positive")
        if opts["grace"] < 0:
            raise CommandError("--grace must not be negative")
        if not queues:
            raise CommandError("--queues names no queue")

        if opts["print_config"]:
            self._print_config(opts, queues, options)
            return

        worker_id = opts["worker_id"] or default_worker_id()
        db_options = connections.settings["default"].setdefault("OPTIONS", {})
        # Every connection this process opens names itself in pg_stat_activity.
        db_options["application_name"] = f"vpay-worker:{worker_id}"[:63]
        # A fenced handler runs inside a transaction the loop holds open for up to the kind's
        # timeout: the server must not kill it as idle-in-transaction before that.
        # (Behind a transaction pooler there are no startup options: the fenced transaction
        # raises it for itself, jobs.runner.invoke.)
        longest_lease_ms = int(max((s.lease_seconds for s in registry.all_specs()), default=60.0) * 1000)
        if longest_lease_ms > settings.DB_IDLE_IN_TX_TIMEOUT_MS and "options" in db_options:
            db_options["options"] = db_options.get("options", "").replace(
                f"idle_in_transaction_session_timeout={settings.DB_IDLE_IN_TX_TIMEOUT_MS}",
                f"idle_in_transaction_session_timeout={longest_lease_ms}",
            )

        problems = fence_ttl_problems()
        try:
            problems += migration_problems()
            if settings.VPAY_DB_POOLER == "transaction":
                self._warn_about_role_timeouts()
        except DatabaseError as exc:
            # Unreachable, silent or blocked: one line naming the bound that stopped it
            # (error_chain redacts: a connection error can quote the DSN it failed on).
            reason = unavailable_message(exc) or error_chain(exc, 500)
            raise CommandError(f"cannot check the migrations, refusing to start: {reason}") from None
        finally:
            connection.close()
        if problems:
            raise CommandError("refusing to start:\n  - " + "\n  - ".join(problems))

        if opts["processes"] > 1:
            supervisor = Supervisor(
                processes=opts["processes"],
                base_id=worker_id,
                burst=opts["burst"],
                run_child=lambda child_id, number: self._run_child(opts, queues, options, child_id, number),
            )
            code = supervisor.run()
            if code:
                raise CommandError("a worker process did not exit cleanly (see its lines above)")
            return
        self._run_worker(opts, queues, options, worker_id)

    def _run_child(self, opts: dict, queues: list[str], options, worker_id: str, number: int) -> int:
        """One supervised worker process (jobs.runner.supervisor): its exit code."""
        port = opts["metrics_port"]
        child_opts = {**opts, "metrics_port": None if port is None else port + number - 1}
        # Its connections name it, as the single worker's do.
        connections.settings["default"]["OPTIONS"]["application_name"] = f"vpay-worker:{worker_id}"[:63]
        try:
            self._run_worker(child_opts, queues, options, worker_id, interrupt=False)
        except CommandError as exc:
            self.stderr.write(str(exc))
            return 1
        return 0

    def _run_worker(self, opts: dict, queues: list[str], options, worker_id: str, *, interrupt: bool = True) -> None:
        """Run one Worker in this process until drained or stopped. ``interrupt``: SIGTERM and
        SIGINT each count (the second exits now); a supervised child (False) leaves SIGINT to
        its supervisor, drains at any SIGTERM and exits now at SIGQUIT."""
        worker = Worker(
            worker_id=worker_id,
            concurrency=opts["concurrency"],
            queues=queues,
            heartbeat_seconds=opts["heartbeat"],
            grace_seconds=opts["grace"],
            burst=opts["burst"],
            metrics_port=opts["metrics_port"],
            metrics_addr=opts["metrics_addr"],
        )
        # Read by the "worker started" line and the ceiling gauges (jobs.primitives.ceilings.publish).
        worker.option_sources = options.sources

        def log_thread_death(args):
            # Through logging, so the redaction filter sees it (the default hook prints raw).
            logging.getLogger("jobs.runner.worker").critical(
                "a worker thread died",
                exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
                extra={"thread_name": getattr(args.thread, "name", "?"), "alert": True},
            )

        threading.excepthook = log_thread_death

        def on_signal(signum, frame):
            # Only set flags here; the main loop does the work.
            worker.request_stop()

        def on_supervised_signal(signum, frame):
            # Under a supervisor (jobs.runner.supervisor): every SIGTERM means drain (one may come
            # from the supervisor and one from a signal to the whole group); SIGQUIT, the
            # supervisor's second, means exit now.
            if signum == signal.SIGQUIT:
                if not worker.stopping:
                    worker.request_stop()
                worker.request_stop()  # a second call: exit now
            elif not worker.stopping:
                worker.request_stop()

        if interrupt:
            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
        else:
            signal.signal(signal.SIGTERM, on_supervised_signal)
            signal.signal(signal.SIGQUIT, on_supervised_signal)

        report, abandoned = worker.run()
        self.stdout.write(f"runworker report: {report.line()}")
        self.stdout.flush()
        if worker.crashed:
            raise CommandError(
                "a worker thread died (see the alert above); exiting so a supervisor restarts the worker"
            )
        if abandoned:
            # Loop threads are still inside handlers; their leases were released (or, on a
            # second signal, left to the reaper). Do not wait for them.
            sys.stderr.flush()
            os._exit(1 if worker.forced else 0)

    def _warn_about_role_timeouts(self) -> None:
        """Behind a pooler the timeouts are the role's: say so loudly when they are missing."""
        timeout_problems = db_role.problems()
        if timeout_problems:
            # A statement without a timeout can hold locks forever; the worker still runs.
            logging.getLogger("jobs.runner.worker").warning(
                "the database role's session defaults differ from the settings: "
                + "; ".join(timeout_problems)
                + " (run `python manage.py dbroletimeouts --apply`)",
                extra={"alert": True},
            )

    def _print_config(self, opts: dict, queues: list[str], options: ceilings.WorkerOptions) -> None:
        """The ceilings this command would start a worker under; no database, no worker."""
        found = ceilings.collect(
            concurrency=opts["concurrency"],
            queues=queues,
            heartbeat_seconds=opts["heartbeat"],
            lease_seconds=opts["heartbeat"] * LEASE_BEATS + LEASE_MARGIN_SECONDS,
            grace_seconds=opts["grace"],
            sources=options.sources,
        )
        if opts["format"] == "json":
            self.stdout.write(json.dumps(ceilings.as_dicts(found), indent=2))
        else:
            self.stdout.write(ceilings.as_table(found))
