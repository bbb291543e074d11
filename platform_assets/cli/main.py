"""``platform``: the operator's command line, on the same code as the Dagster jobs.

    platform [--config FILE] COMMAND ...
    platform status [PIPELINE] [--json] [--audit | --full-audit]   offsets, lag, checks
    platform validate [--offline]       specs + Kafka + catalog + group-id consistency
    platform reset PIPELINE --to earliest|latest|timestamp:MS [--apply --by WHO --reason WHY]
    platform migrate-group PIPELINE NEW_GROUP --by WHO --reason WHY
    platform maintain PIPELINE [--retention-hours H] [--orphan-window-hours H]
    platform failover PIPELINE --to REPLICA|primary [--dry-run] --reason WHY [--by WHO]
    platform complete-failback PIPELINE [--dry-run] --reason WHY [--by WHO]
    platform release-late-copies PIPELINE --reason WHY [--by WHO]
    platform metrics [--host H] [--port 9464] [--window S]   the Prometheus/OpenMetrics endpoint

Connection settings come from the same configuration as the code location's
(``resources.config``: the file named by ``--config``, else by ``$PLATFORM_CONFIG``, else the
embedded stack's defaults), read when the command runs; ``validate`` names a wrong key first,
and ``validate --offline`` checks the configuration and the pipelines file without connecting
to anything (before a deployment, in CI). A reset (applied)
and a migration first count the pipeline's active Dagster runs in the instance of
``DAGSTER_HOME`` (or the embedded ``state_dir/dagster_home``, where ``make dev`` keeps it) and
refuse
while there are any; without an instance they rely on their compare-and-set commit alone (a run
in flight then aborts at its own commit, naming the action).

``status`` answers in seconds: it reads the exactly-once audit's last verdict (the asset check
``exactly_once_audit``, with its time and run) from that same instance instead of recounting
Kafka, and names it as not evaluated without one; ``--audit`` runs the budgeted incremental audit
now, ``--full-audit`` the full one (``--skip-audit``, the old way to skip it, is accepted and does
nothing). Its ages are measured after any audit (``platform_assets.cli.status``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from ingestion.exceptions import IngestionError, PipelineSpecError
from ingestion.health.checks import GROUP_CHECK
from ingestion.ops.maintenance import MAINTENANCE_STEPS
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.cli.actions import run_action
from platform_assets.cli.status import AuditMode, iter_statuses, pipeline_status, print_status
from platform_assets.metrics import DEFAULT_PORT, DEFAULT_WINDOW_S
from platform_assets.pipelines import load_pipelines
from resources.config import CONFIG_ENV, ConfigError, PlatformConfig, config_path, load_config
from resources.factory import iceberg_resource, kafka_resource, redact, unresolved
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.stack_env import STACK_FILE, load_stack_env

CONNECT_TIMEOUT_S = 10.0
# ``platform metrics`` listens on every interface by default: Prometheus scrapes it from another
# host, and it serves names and figures only (no secret reaches a label).
EVERY_INTERFACE = "0.0.0.0"  # noqa: S104


def read_platform_config() -> PlatformConfig:
    """The configuration as written; a clear exit naming the file and key when it is invalid."""
    try:
        return load_config()
    except ConfigError as exc:
        raise SystemExit(f"platform: invalid configuration:\n{exc}") from None


def load_platform_config() -> PlatformConfig:
    """The configuration, every reference resolvable; a clear exit naming the key otherwise."""
    config = read_platform_config()
    missing = unresolved(config, dict(os.environ))
    if missing:
        raise SystemExit(
            "platform: configuration refers to unset environment variables (set them, or give "
            "a default as ${NAME:-value}):\n  " + "\n  ".join(missing)
        )
    return config


class _ClientLog(logging.Handler):
    """A librdkafka client's log lines, kept instead of printed (``logger`` client property):
    the last one names the cause (e.g. "Connect to ipv4#10.0.0.7:9092 failed: Connection
    refused")."""

    def __init__(self) -> None:
        super().__init__()
        self.last = ""
        self.logger = logging.getLogger(f"platform.librdkafka.{id(self)}")
        self.logger.propagate = False
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.last = record.getMessage().rsplit("]: ", 1)[-1]


def connect(
    config: PlatformConfig, check_kafka: bool = True
) -> tuple[KafkaResource, IcebergCatalogResource]:
    """The resources of ``config``; Kafka must answer (unless not ``check_kafka``: a failover
    runs while the primary is down) and the catalog load."""
    from confluent_kafka import KafkaException

    kafka, iceberg = kafka_resource(config), iceberg_resource(config)
    if check_kafka:
        said = _ClientLog()
        admin = kafka.get_admin_client(logger=said.logger)  # its log: one line below
        try:
            admin.list_topics(timeout=CONNECT_TIMEOUT_S)
        except KafkaException as exc:
            admin.poll(0)  # serves the queued log lines to ``said``
            last = f"; the client said: {said.last}" if said.last else ""
            raise SystemExit(
                "platform: no Kafka broker answered at "
                f"{kafka.client_config()['bootstrap.servers']} within {CONNECT_TIMEOUT_S:.0f} s "
                f"({exc.args[0].str()}{last}). Check kafka.bootstrap_servers and "
                "kafka.properties in the configuration, and that the broker is up."
            ) from None
    try:
        iceberg.load_catalog()
    except Exception as exc:  # any catalog backend's own error types
        raise SystemExit(
            f"platform: the Iceberg catalog {config.catalog.name!r} ({iceberg.source()}) did not "
            f"load: {type(exc).__name__}: {redact(str(exc)[:300], config)}. Check "
            "catalog.properties and "
            "file_io in the configuration."
        ) from None
    return kafka, iceberg


def replica_config_problems(specs: list[PipelineSpec], kafka: KafkaResource) -> list[str]:
    """What ``validate`` finds wrong in the replicas' configuration: [] when no pipeline declares
    replicas and none is configured (then nothing of the disaster-recovery add-on is loaded); a
    replica cluster configured ahead of the pipelines that will name it is still probed."""
    if not kafka.replicas and not any(spec.replicas for spec in specs):
        return []
    from platform_assets.dr.checks import replica_config_problems as problems

    return problems(specs, kafka)


def find_stack() -> str:
    """Apply the settings of the ``make dev`` running here, unless a configuration file was
    named; return a line naming the stack the command talks to.

    ``make dev`` publishes its broker's address, its ``DAGSTER_HOME`` and the rest in the
    ``.env`` of the directory it runs in and in its state folder's ``stack.env``
    (``resources.stack_env``): the latter is read when ``PLATFORM_STATE_DIR`` names the folder,
    else the former. A variable the shell set to another value wins, and then nothing of the
    file is used (the line says which).
    """
    named = config_path()
    if named is not None:
        return f"stack: the configuration {named}"
    named_state = os.environ.get("PLATFORM_STATE_DIR")
    state_dir = Path(named_state) if named_state else None
    found = load_stack_env(Path.cwd(), state_dir)
    if found is not None:
        return found.describe()
    looked = state_dir / STACK_FILE if state_dir is not None else Path.cwd() / ".env"
    return (
        f"stack: the embedded defaults (no make dev published its settings in {looked}; "
        f"set {CONFIG_ENV} or --config for another)"
    )


def load_specs() -> dict[str, PipelineSpec]:
    """Every pipeline spec by name; a clear exit naming the file, line and key otherwise."""
    try:
        return {spec.name: spec for spec in load_pipelines()}
    except PipelineSpecError as exc:
        raise SystemExit(f"platform: invalid pipelines file:\n{exc}") from None


def validate_offline() -> int:
    """The configuration and the pipelines file, connecting to nothing; environment
    variables the configuration refers to and that are unset here are listed, not fatal (they
    are needed where the platform runs)."""
    config = read_platform_config()
    specs = load_specs()
    source = config_path() or "defaults (the embedded stack)"
    print(f"configuration {source}: valid (offline: nothing was connected to)")
    print(f"{len(specs)} pipeline spec(s) valid: {', '.join(sorted(specs))}")
    missing = unresolved(config, dict(os.environ))
    if missing:
        print("unset here, needed where it runs:\n  " + "\n  ".join(missing))
    return 0


def serve_metrics(config: PlatformConfig, host: str, port: int, window_s: float) -> int:
    """``platform metrics``: serve :class:`platform_assets.metrics.PlatformCollector` until
    Ctrl-C or SIGTERM. Nothing is connected to at start: a pipeline that cannot be read at a
    scrape shows ``kafka_iceberg_pipeline_up 0`` (the reason in this process's log), so the
    endpoint outlives a broker or catalog outage. The checks come from the Dagster instance of
    ``DAGSTER_HOME`` (or ``make dev``'s); without one they are left out."""
    import signal
    import threading

    from platform_assets.cli.actions import dagster_home
    from platform_assets.instance import open_instance
    from platform_assets.metrics import PlatformCollector, serve

    kafka, iceberg = kafka_resource(config), iceberg_resource(config)
    home = dagster_home(iceberg)
    instance = open_instance(home) if home else None
    collector = PlatformCollector(
        kafka, iceberg, instance, window_s, redact=lambda text: redact(text, config)
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.set())
    try:
        server = serve(collector, host, port)
    except OSError as exc:
        raise SystemExit(f"platform: cannot listen on {host}:{port}: {exc}") from None
    shown = "127.0.0.1" if host in (EVERY_INTERFACE, "") else host
    checks = f"checks from {home}" if instance is not None else "no Dagster instance: no checks"
    print(f"metrics: http://{shown}:{port}/metrics ({checks}); Ctrl-C stops", flush=True)
    try:
        stop.wait()
    finally:
        server.shutdown()
        collector.close()
        if instance is not None:
            instance.dispose()
    return 0


def show_status(
    args: argparse.Namespace,
    specs: list[PipelineSpec],
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
) -> int:
    """``platform status``: every pipeline's status, each printed as soon as it is assembled
    (``--json``: one document, each status with the instant its ages were taken, ``as_of``).
    Exits 0 whatever the checks say."""
    if args.skip_audit:
        print(
            "platform: --skip-audit is deprecated and does nothing: status no longer audits "
            "unless --audit or --full-audit",
            file=sys.stderr,
        )
    mode: AuditMode = "full" if args.full_audit else "incremental" if args.audit else "recorded"
    statuses = iter_statuses(specs, kafka, iceberg, mode)
    if args.output == "json" or args.json:
        print(json.dumps([item.to_dict() for item in statuses], indent=2))
        return 0
    for item in statuses:
        print_status(item)
    return 0


APPLY_HELP = "do it (default: a dry run that shows what it would do and changes nothing)"


def _operator(command: argparse.ArgumentParser, reason_required: bool = True) -> None:
    """The options every command that changes state shares: ``--apply`` (every such command
    is a dry run without it), who asks and why (recorded in the commit)."""
    command.add_argument("--apply", action="store_true", help=APPLY_HELP)
    command.add_argument("--by", default=os.environ.get("USER", "operator"), help="who asks")
    if reason_required:
        command.add_argument("--reason", required=True, help="why (recorded with the change)")
    else:
        command.add_argument("--reason", default="", help="why (recorded with the change)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="platform", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"the platform configuration (default: ${CONFIG_ENV}, else the embedded stack's)",
    )
    parser.add_argument(
        "--output",
        choices=("text", "json"),
        default="text",
        help="json: one JSON document on stdout, for scripts (status: its figures; validate: "
        "whether valid and why; the others: what they did or would do)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = commands.add_parser(
        "status", help="offsets, lag, last commit and checks of every pipeline, or of one"
    )
    status.add_argument("pipeline", nargs="?", help="one pipeline (default: all)")
    status.add_argument("--json", action="store_true", help="the same as --output json")
    audit = status.add_mutually_exclusive_group()
    audit.add_argument(
        "--audit",
        action="store_true",
        help="run the exactly-once audit now: recount the newest commits in Kafka within its "
        "budget (seconds to minutes); default: report its last evaluation in the Dagster "
        "instance, with when it was taken",
    )
    audit.add_argument(
        "--full-audit",
        action="store_true",
        help="run the full audit now: recount every commit, scan every row",
    )
    audit.add_argument(
        "--skip-audit",
        action="store_true",
        help="deprecated, does nothing: status no longer audits unless --audit or --full-audit "
        "(accepted so existing scripts keep working)",
    )
    validate = commands.add_parser(
        "validate",
        help="check the configuration, the pipeline specs, Kafka, the catalog and group ids",
    )
    validate.add_argument(
        "--offline",
        action="store_true",
        help="check the configuration and the pipelines file only; connect to nothing",
    )
    reset = commands.add_parser(
        "reset",
        help="move a pipeline's committed offsets, as kafka-consumer-groups --reset-offsets does",
    )
    reset.add_argument("pipeline")
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--to-earliest", action="store_true", help="each partition's log start")
    where.add_argument("--to-latest", action="store_true", help="each partition's end")
    where.add_argument(
        "--to-datetime", metavar="ISO", help="the first record at or after, e.g. 2026-11-28T06:00Z"
    )
    where.add_argument("--to-offset", type=int, metavar="N", help="offset N (clamped to the log)")
    where.add_argument(
        "--shift-by", type=int, metavar="N", help="the committed offset plus N (negative: back)"
    )
    where.add_argument("--to", help="earliest, latest or timestamp:<epoch-ms> (older spelling)")
    reset.add_argument(
        "--topic",
        action="append",
        metavar="TOPIC[:P,...]",
        help="only these partitions (repeatable; default: all); the others keep their offsets",
    )
    _operator(reset, reason_required=False)
    rollback = commands.add_parser(
        "rollback",
        help="take a pipeline back to one of its commits: the rows read since are deleted and "
        "read again, recorded as a reset",
    )
    rollback.add_argument("pipeline")
    rollback.add_argument(
        "--to-snapshot", type=int, required=True, metavar="ID", help="a commit of the pipeline"
    )
    _operator(rollback, reason_required=False)
    migrate = commands.add_parser(
        "migrate-group", help="move a pipeline's offsets to a new consumer group id"
    )
    migrate.add_argument("pipeline")
    migrate.add_argument("new_group")
    _operator(migrate)
    maintain = commands.add_parser(
        "maintain", help="compact, expire snapshots and remove orphan files of a pipeline's tables"
    )
    maintain.add_argument("pipeline")
    # Defaults: the pipeline's own (snapshot_retention_hours), as its maintenance schedule uses.
    maintain.add_argument("--retention-hours", type=float, default=None)
    maintain.add_argument("--orphan-window-hours", type=float, default=None)
    maintain.add_argument(
        "--steps",
        default=",".join(MAINTENANCE_STEPS),
        help=f"which of {', '.join(MAINTENANCE_STEPS)} to run, comma-separated (default: all)",
    )
    _operator(maintain, reason_required=False)
    failover = commands.add_parser(
        "failover", help="switch a pipeline to a replica cluster, or back to the primary"
    )
    failover.add_argument("pipeline")
    failover.add_argument("--to", required=True, help="a replica's name, or primary (failback)")
    failover.add_argument(
        "--source-lost",
        action="store_true",
        help="the cluster the pipeline reads is lost and MM2 copies nothing more from it: "
        "accept a table ahead of MM2's copy (--to a replica), or fail back from a lost replica "
        "without reading it (--to primary; its records not copied back are lost)",
    )
    _operator(failover)
    complete = commands.add_parser(
        "complete-failback", help="end a failback's route once its reverse copies are drained"
    )
    complete.add_argument("pipeline")
    _operator(complete)
    release = commands.add_parser(
        "release-late-copies",
        help="the cluster a --source-lost failover left is lost for good: stop waiting for it "
        "to tell MM2's late copies (R54; releases every entry of the route's guard)",
    )
    release.add_argument("pipeline")
    _operator(release)
    clear = commands.add_parser(
        "clear-dead-runs",
        help="mark failed the pipeline's ingestion runs that Dagster shows in progress but whose "
        "process is provably gone (killed on this host); runs that may be alive are left alone",
    )
    clear.add_argument("pipeline")
    clear.add_argument("--apply", action="store_true", help=APPLY_HELP)
    metrics = commands.add_parser(
        "metrics",
        help="serve every pipeline's lag, commits, throughput, dead letters and check states "
        "on an OpenMetrics endpoint for Prometheus, read at each scrape (until Ctrl-C)",
    )
    metrics.add_argument(
        "--host", default=EVERY_INTERFACE, help="address to listen on (default: every interface)"
    )
    metrics.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT})"
    )
    metrics.add_argument(
        "--window",
        type=float,
        default=DEFAULT_WINDOW_S,
        metavar="SECONDS",
        help=f"the rates' window (default: {DEFAULT_WINDOW_S:g})",
    )
    args = parser.parse_args(argv)
    if args.config:  # for every reader of the configuration, the pipelines file's too
        os.environ[CONFIG_ENV] = args.config
    if args.command == "validate" and args.offline:
        return validate_offline()
    print(find_stack(), file=sys.stderr, flush=True)  # stdout stays the command's (--json)
    config = load_platform_config()
    specs = load_specs()
    if getattr(args, "pipeline", None) and args.pipeline not in specs:
        raise SystemExit(f"platform: unknown pipeline {args.pipeline!r}; known: {sorted(specs)}")
    if args.command == "status" and args.pipeline:
        specs = {args.pipeline: specs[args.pipeline]}
    if args.command == "metrics":
        return serve_metrics(config, args.host, args.port, args.window)
    kafka, iceberg = connect(
        config,
        check_kafka=args.command not in ("failover", "release-late-copies", "clear-dead-runs"),
    )
    if args.command == "status":
        return show_status(args, list(specs.values()), kafka, iceberg)
    if args.command == "validate":
        statuses = [pipeline_status(spec, kafka, iceberg, audit=False) for spec in specs.values()]
        blocking = [s for s in statuses if GROUP_CHECK.name in s.failing]
        problems = [f"{item.pipeline}: {item.failing[GROUP_CHECK.name]}" for item in blocking]
        problems += replica_config_problems(list(specs.values()), kafka)
        if not problems:
            source = config_path() or "defaults (the embedded stack)"
            catalog = f"{config.catalog.name!r} ({iceberg.source()})"
            lines = [
                f"configuration {source}: valid; catalog {catalog}",
                f"{len(statuses)} pipeline(s) valid: specs, Kafka, catalog and group ids agree",
            ]
        if args.output == "json":
            print(json.dumps({"valid": not problems, "problems": problems}, indent=2))
        else:
            print("\n".join(problems or lines))
        return 1 if problems else 0
    if args.pipeline not in specs:
        raise SystemExit(f"platform: unknown pipeline {args.pipeline!r}; known: {sorted(specs)}")
    spec = specs[args.pipeline]
    command = args.command
    try:
        lines = run_action(args, spec, kafka, iceberg)
    except IngestionError as exc:
        raise SystemExit(f"platform: {exc}") from None
    if args.output == "json":
        document = {"command": command, "pipeline": spec.name, "applied": args.apply}
        print(json.dumps({**document, "lines": lines}, indent=2))
    else:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
