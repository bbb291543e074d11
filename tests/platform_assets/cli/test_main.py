"""The operator CLI on the real stack, for the demo pipeline of pipelines.yaml."""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path
from typing import Any

import pytest

from ingestion.pipeline.run import run_pipeline
from platform_assets.cli.main import main
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.platform_assets.cli.conftest import Demo, orders
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import NewPipeline, records

pytestmark = pytest.mark.integration


def test_status_validate_reset_and_maintain(
    demo: Demo, capsys: pytest.CaptureFixture[str], ledger_producer: LedgerProducer, demo_topic: str
) -> None:
    assert main(["status", "--audit"]) == 0  # the audit recounted now
    text = capsys.readouterr().out
    assert "orders  table=demo.orders  group=platform-orders" in text
    assert "lag: 0 records" in text
    assert "checks: all 6 pass" in text
    assert "exactly_once_audit" in text
    assert "commit (newest first)" in text  # the newest commits, with their counts
    produced_ms = int(time.time() * 1000)
    ledger_producer.produce(demo_topic, orders(100, 5))
    time.sleep(1.0)
    assert main(["status", "--json", "--audit"]) == 0
    (status,) = json.loads(capsys.readouterr().out)
    assert status["lag_records"] == 5
    newest = status["commits"][0]
    assert newest["inserts"] == newest["records"]  # an append commit: every record a row
    assert newest["updates"] == newest["deletes"] == 0
    assert status["checks"]["exactly_once_audit"]["passed"] is True
    waited_s = (int(time.time() * 1000) - produced_ms) / 1000
    assert 1.0 <= status["oldest_uncommitted_age_s"] <= waited_s + 0.2
    lagging = [p for p in status["partitions"] if p["lag"]]
    assert lagging
    assert all(p["oldest_uncommitted_age_s"] is not None for p in lagging)
    assert all(p["committed"] == p["mirrored"] for p in status["partitions"])
    assert main(["status", "orders"]) == 0  # one pipeline, no audit (no instance: named)
    text = capsys.readouterr().out
    assert "lag: 5 records (oldest uncommitted" in text
    assert "skipped exactly_once_audit: not evaluated yet: no Dagster instance" in text
    ledger_producer.produce(demo_topic, records(3))  # not orders: quarantined
    demo.ingest()
    assert main(["status"]) == 0  # status reports failing checks; it does not fail
    # 3 bad records among whatever the shared demo topic held (other tests produce to it too).
    assert re.search(r"FAILING dead_letter_rate: 3 of \d+ records", capsys.readouterr().out)
    table_rows = demo.catalog.load_table("demo.orders").scan().to_arrow().num_rows
    assert main(["status", "--json", "--skip-audit"]) == 0  # deprecated: accepted, a no-op
    said = capsys.readouterr()
    assert "--skip-audit is deprecated and does nothing" in said.err
    (now,) = json.loads(said.out)
    previous = str(now["commits"][1]["snapshot_id"])  # the commit before the last ingestion
    assert main(["rollback", "orders", "--to-snapshot", previous]) == 0  # a dry run
    assert "re-read" in capsys.readouterr().out
    assert demo.catalog.load_table("demo.orders").scan().to_arrow().num_rows == table_rows
    rollback = ["rollback", "orders", "--to-snapshot", previous, "--apply", "--reason", "bad"]
    assert main(rollback) == 0
    assert "committed in snapshot" in capsys.readouterr().out
    assert demo.catalog.load_table("demo.orders").scan().to_arrow().num_rows < table_rows
    with pytest.raises(SystemExit, match="is not in the table's history"):
        main(["rollback", "orders", "--to-snapshot", "12345"])
    demo.ingest()  # read again once
    assert main(["validate"]) == 0
    assert "1 pipeline(s) valid" in capsys.readouterr().out
    assert main(["--output", "json", "validate"]) == 0  # for scripts: one JSON document
    assert json.loads(capsys.readouterr().out) == {"valid": True, "problems": []}
    assert main(["--output", "json", "reset", "orders", "--to-latest"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert (planned["command"], planned["pipeline"], planned["applied"]) == (
        "reset",
        "orders",
        False,
    )
    assert planned["lines"][-1] == "dry run: nothing committed (add --apply)"

    assert main(["status", "--json", "--skip-audit"]) == 0
    (before,) = json.loads(capsys.readouterr().out)
    committed = {p["partition"]: p["committed"] for p in before["partitions"]}
    assert main(["reset", "orders", "--shift-by", "-1", "--topic", "orders:1"]) == 0  # dry run
    shifted = capsys.readouterr().out
    one = committed["orders:1"]
    assert f"orders[1]: {one} -> {max(one - 1, 0)}" in shifted
    assert "orders[0]: {0} -> {0} (unchanged)".format(committed["orders:0"]) in shifted
    assert main(["reset", "orders", "--to-earliest", "--topic", "orders:1", "--apply"]) == 0
    capsys.readouterr()
    assert main(["status", "--json", "--skip-audit"]) == 0
    (after,) = json.loads(capsys.readouterr().out)
    moved = {p["partition"]: p["committed"] for p in after["partitions"]}
    assert moved == {**committed, "orders:1": 0}  # the one partition, the others as they were
    with pytest.raises(SystemExit, match=r"no partition \[\('orders', 9\)\]"):
        main(["reset", "orders", "--to-offset", "3", "--topic", "orders:9"])
    assert main(["reset", "orders", "--to", "earliest"]) == 0
    dry = capsys.readouterr().out
    assert "re-read" in dry
    assert "dry run: nothing committed" in dry
    assert main(["reset", "orders", "--to", "earliest", "--apply", "--reason", "test"]) == 0
    assert "committed in snapshot" in capsys.readouterr().out
    assert demo.catalog.load_table("demo.orders").scan().to_arrow().num_rows == 0
    assert main(["status", "--json", "--audit"]) == 0  # it reads a snapshot with no data file
    (status,) = json.loads(capsys.readouterr().out)
    assert status["lag_records"] == sum(p["end"] for p in status["partitions"]) >= 20
    assert status["checks"]["exactly_once_audit"]["passed"], status["checks"]["exactly_once_audit"]
    assert main(["maintain", "--apply", "orders", "--retention-hours", "0"]) == 0
    assert "kept" in capsys.readouterr().out


def documented_cli_examples() -> list[list[str]]:
    """The ``platform`` command lines of docs/operate.md, in order, without their optional
    ``[...]``."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "operate.md").read_text()
    lines = re.findall(r"^\.venv/bin/platform (.+)$", text, flags=re.MULTILINE)
    return [shlex.split(re.sub(r"\[[^]]*\]", "", line), comments=True) for line in lines]


def test_documented_cli_examples_run(demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    """Every ``platform`` example of docs/operate.md, as written, on the demo pipeline."""
    capsys.readouterr()
    examples = documented_cli_examples()
    commands = [example[0] for example in examples]
    assert commands == [
        "status",
        "validate",
        "validate",
        "reset",
        "reset",
        "reset",
        "migrate-group",
        "migrate-group",
        "maintain",
        "maintain",
    ]
    for example in examples:
        assert main(example) == 0, example
    out = capsys.readouterr().out
    assert "dry run: nothing committed" in out
    assert "committed in snapshot" in out
    assert "would carry 'platform-orders''s offsets" in out
    assert "would expire" in out
    assert "dry run: nothing changed (add --apply)" in out
    assert "connect-sink-group" in out
    assert "(offline: nothing was connected to)" in out


def test_operator_jobs_in_dagster(
    kafka: KafkaResource, tmp_path: Path, new_pipeline: NewPipeline
) -> None:
    """The reset (dry run, then applied), migration and maintenance jobs with typed config."""
    from dagster import DagsterInstance

    from platform_assets.operations.jobs import build_ops_jobs

    _, spec = new_pipeline("ops_jobs", produce=10)
    iceberg = IcebergCatalogResource(state_dir=str(tmp_path))
    run_pipeline(spec, kafka.client_config(), iceberg.load_catalog(), None, kafka.get_cluster_id())
    reset_job, migrate_job, maintain_job = build_ops_jobs([spec])
    resources = {"kafka": kafka, "iceberg": iceberg}

    def run(job: Any, config: dict[str, Any]) -> Any:
        with DagsterInstance.ephemeral() as instance:
            op_name = job.graph.node_defs[0].name
            return job.execute_in_process(
                run_config={"ops": {op_name: {"config": config}}},
                resources=resources,
                instance=instance,
            )

    dry = run(reset_job, {"pipeline": "ops_jobs", "to": "earliest"})
    assert dry.success
    table = iceberg.load_catalog().load_table(spec.table)
    assert table.scan().to_arrow().num_rows == 10  # dry run: nothing changed
    assert run(reset_job, {"pipeline": "ops_jobs", "to": "earliest", "apply": True}).success
    assert iceberg.load_catalog().load_table(spec.table).scan().to_arrow().num_rows == 0
    migrated = run(
        migrate_job, {"pipeline": "ops_jobs", "new_group_id": "ops-jobs-new", "reason": "test"}
    )
    assert migrated.success
    maintained = run(maintain_job, {"pipeline": "ops_jobs", "snapshot_retention_hours": 0})
    assert maintained.success


def test_unreachable_kafka_is_named(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """No traceback, and one line: the command says which address did not answer, what the
    client last said and what to check; librdkafka prints nothing of its own."""
    from platform_assets.cli import main as cli
    from resources.embedded import find_free_port

    address = f"127.0.0.1:{find_free_port()}"  # nothing listens there
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", address)
    monkeypatch.setattr(cli, "CONNECT_TIMEOUT_S", 2.0)
    with pytest.raises(SystemExit, match=f"no Kafka broker answered at {address} within 2 s"):
        main(["status"])
    err = capfd.readouterr().err
    # librdkafka's own log lines about the address, routed away. The worker's stderr can hold
    # another test's client still retrying a broker that stopped (another address): not ours.
    ours = [line for line in err.splitlines() if line.startswith("%") and address in line]
    assert not ours, err
    with pytest.raises(SystemExit, match=r"the client said: .*Connect to ipv4#.* refused"):
        main(["validate"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pipelines:\n  - name: a\n    topic: [t\n", r".*p\.yaml:4: not valid YAML: expected ','"),
        (
            "pipelines:\n  - name: a\n    topic: t\n    table: x.a\n    consumer_group_id: g\n"
            "    value_format: json\n    schema:\n      - {name: id, type: lung}\n",
            r"pipeline 'a' is invalid:\n  .*p\.yaml:8: schema\.0\.type: unknown type",
        ),
    ],
)
def test_a_bad_pipelines_file_is_named_by_file_and_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str, message: str
) -> None:
    """The file, the line and the key, before anything connects."""
    path = tmp_path / "p.yaml"
    path.write_text(text)
    monkeypatch.setenv("PLATFORM_PIPELINES_FILE", str(path))
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    with pytest.raises(SystemExit, match=f"platform: invalid pipelines file:\\n{message}"):
        main(["validate"])


def test_help_describes_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    listed = re.search(r"COMMAND\n(.*?)\n\n", text, flags=re.DOTALL)
    assert listed is not None
    entries = re.findall(r"^    (\S+)(.*)$", listed.group(1), flags=re.MULTILINE)
    names = [name for name, _ in entries]
    assert names == [
        "status",
        "validate",
        "reset",
        "rollback",
        "migrate-group",
        "maintain",
        "failover",
        "complete-failback",
        "release-late-copies",
        "clear-dead-runs",
        "metrics",
    ]
    described = re.split(r"\n    (?=\S)", listed.group(1))
    assert all(len(entry.split()) > 2 for entry in described), described  # a description each


def test_validate_offline_connects_to_nothing_and_names_what_is_unset(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--config`` names the file; Kafka's address is an unset reference: listed, not fatal."""
    config = tmp_path / "platform.yaml"
    config.write_text("kafka:\n  bootstrap_servers: ${PROD_KAFKA}\n")
    monkeypatch.delenv("PROD_KAFKA", raising=False)
    monkeypatch.setenv("PLATFORM_CONFIG", "/nonexistent")  # --config wins; restored after
    assert main(["--config", str(config), "validate", "--offline"]) == 0
    out = capsys.readouterr().out
    assert f"configuration {config}: valid (offline" in out
    assert "1 pipeline spec(s) valid: orders" in out
    assert "kafka.bootstrap_servers: PROD_KAFKA" in out
    config.write_text("kafka:\n  bootstrap: x\n")
    with pytest.raises(SystemExit, match=r"kafka\.bootstrap: Extra inputs"):
        main(["--config", str(config), "validate", "--offline"])


def test_status_of_an_unknown_pipeline_is_refused_before_connecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")  # nothing listens: unused
    with pytest.raises(SystemExit, match=r"unknown pipeline 'nope'; known: \['orders'\]"):
        main(["status", "nope"])


def test_metrics_serves_the_pipelines_until_interrupted(demo: Demo, tmp_path: Path) -> None:
    """``platform metrics`` through its entry point: it prints its address, serves the demo
    pipeline's figures (read from the table and Kafka at the scrape, the checks from the
    instance of ``DAGSTER_HOME``) and exits 0 on Ctrl-C."""
    import os
    import signal
    import subprocess
    import sys
    import urllib.request

    from platform_assets.instance import create_storage
    from resources.embedded import find_free_port

    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    create_storage(home)  # as make dev does: the endpoint opens an instance, never creates one
    port = find_free_port()
    command = [sys.executable, "-m", "platform_assets.cli.main", "metrics", "--host", "127.0.0.1"]
    process = subprocess.Popen(
        [*command, "--port", str(port)],
        env={**os.environ, "DAGSTER_HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        stack = process.stdout.readline()  # the stack it talks to, then its address
        assert stack.startswith("stack: the embedded defaults"), stack
        first = process.stdout.readline()
        assert first.startswith(f"metrics: http://127.0.0.1:{port}/metrics (checks from "), first
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as response:
            text = response.read().decode()
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert 'kafka_iceberg_pipeline_up{pipeline="orders"} 1.0' in text
    rows = len(demo.catalog.load_table("demo.orders").scan().to_arrow())  # the session's topic
    assert f'kafka_iceberg_table_records{{pipeline="orders"}} {float(rows)}' in text
    lags = re.findall(r"^kafka_iceberg_lag_records\{[^}]*\} (\S+)$", text, flags=re.MULTILINE)
    assert lags
    assert {float(lag) for lag in lags} == {0.0}
    assert 'state="unknown"} 1.0' in text  # no check evaluated in this instance yet
