"""The late-copy guard suite (R54): what a route guarded by a ``--source-lost`` switch costs.

    .venv/bin/python bench/run.py --suite late-copies [--records 200000] [--repeats 5]
        [--uncopied 1000 100000] [--late-copies K]

Two embedded brokers, ``primary`` and ``dr``. The guarded routes are set up the way production
gets them (bench/late_copies_setup.py): an RPO tail of ``--uncopied`` records ingested from the
primary, never copied by MM2 (the stand-in), then a real ``failover --to dr --source-lost``
(``platform_assets.dr.failover.failover_pipeline``), which writes ``kafka.uncopied.<group>``; the
table property is not written by hand. Cases, each its own pipeline and table:

- ``plain``: a pipeline without replicas on a topic of ``dr`` (the baseline);
- ``guarded <U>``: the route after the switch with U uncopied records, no candidate among the
  records read (the common case: the filter's cost only);
- ``late copies``: the route with the first U, and in every round ``--late-copies`` records
  (default 0.1 %) that are byte-for-byte copies of uncopied originals (timestamp, key, value,
  headers, partition: what MM2's forward flow writes when the primary comes back), plus one
  near miss (an original's timestamp and key, another value). Each run meets candidates, sets
  them aside, reads the originals on the primary and reruns the tasks (``prepare_files``).

Every round produces the same N order events to every case's topic (stamped now: after the
tail), then runs every case once, in turn first, through ``run_pipeline`` on its route
(``local[2]``, ``cluster_config`` as the Dagster asset passes it; runs of at most 10,000
offsets, the smoke test's, in-process). Shown: the median run, and the median over rounds of
the ratio to ``plain`` in the same round (drift over the run cancels out). Rate: offsets
consumed (rows landed + late copies skipped) per second of the run. Checks (else
``COUNT-MISMATCH``, exit status 1): every run landed N rows (N + 1 with the near miss) and
skipped exactly the late copies produced; read back, every table holds the rows expected, the
commits list every late copy's offset as skipped, none landed, the near misses did.
"""

from __future__ import annotations

from typing import Any

from bench.late_copies_setup import (
    Routed,
    guard_routes,
    make_round,
    near_miss,
    plain_spec,
    send,
    with_extras,
)

PARTITIONS = 6
SLOTS = 2
LATE = "late copies"


def run_late_copy_suite(
    kafka: Any,
    dr_kafka: Any,
    iceberg: Any,
    records: int,
    repeats: int,
    uncopied: list[int],
    late: int | None = None,
) -> list[dict[str, Any]]:
    """Set up every case, run ``repeats`` rounds, check; one result per case."""
    from confluent_kafka.admin import NewTopic

    from ingestion.pipeline.run import run_pipeline
    from resources.spark import SparkResource

    late = max(1, records // 1000) if late is None else late
    tails = {f"guarded_{u}": u for u in uncopied} | {"late_copies": uncopied[0]}
    routed = guard_routes(kafka, iceberg, tails, PARTITIONS)
    names = {"plain": "plain", **{f"guarded_{u}": f"guarded {u:,}" for u in uncopied}}
    names["late_copies"] = LATE
    dr = dr_kafka.client_config()
    admin = dr_kafka.get_admin_client()
    for future in admin.create_topics(
        [NewTopic(t, PARTITIONS, 1) for t in ("plain", "warm")]
    ).values():
        future.result(15)
    catalog = iceberg.load_catalog()
    spark_resource = SparkResource(master=f"local[{SLOTS}]")
    spark = lambda: spark_resource.spark_session  # noqa: E731 - started by the first large run
    send(dr, "warm", make_round(min(records, 20_000), PARTITIONS, 0))
    run_pipeline(plain_spec("lc_warm", "warm"), dr, catalog, spark, dr_kafka.get_cluster_id())
    originals = routed["late_copies"].originals
    runs: dict[str, list[Any]] = {name: [] for name in names}
    noted: list[tuple[str, int, int]] = []
    for repeat in range(repeats):
        base = make_round(records, PARTITIONS, seed=42 + repeat)
        picked = [originals[(repeat * (late + 1) + i) % len(originals)] for i in range(late + 1)]
        extras = [(o, "late") for o in picked[:late]] + [(near_miss(picked[late]), "near")]
        send(dr, "plain", base)
        for name, case in routed.items():
            copy = case.route.spec.source_topics[0]
            noted += send(dr, copy, with_extras(base, extras) if name == "late_copies" else base)
        order = list(names)[repeat % len(names) :] + list(names)[: repeat % len(names)]
        for name in order:  # every case once per round, in turn first: drift weighs on all alike
            runs[name].append(run_case(name, routed.get(name), kafka, catalog, spark, dr_kafka))
    spark_resource.stop_session()
    results = []
    for name, label in names.items():
        extra = late if name == "late_copies" else 0
        expected = [(records + (1 if extra else 0), extra)] * repeats
        ratios = [rate(r) / rate(p) for r, p in zip(runs[name], runs["plain"], strict=True)]
        report = sorted(runs[name], key=lambda r: r.timings_s["total"])[repeats // 2]
        results.append(
            {
                "case": label,
                "uncopied": tails.get(name, 0),
                "records": report.records,
                "late_copies": report.skipped,
                "expected": expected[0],
                "runs_exact": [(r.records, r.skipped) for r in runs[name]] == expected,
                "read_back": check_table(catalog, name, routed.get(name), records, repeats, noted),
                "seconds": round(report.timings_s["total"], 2),
                "all_seconds": [round(r.timings_s["total"], 2) for r in runs[name]],
                "prepare_seconds": [round(r.timings_s["prepare"], 2) for r in runs[name]],
                "records_per_s": round(rate(report)),
                "ratios": [round(x, 3) for x in ratios],
                "ratio": round(sorted(ratios)[repeats // 2], 3),
            }
        )
        print(f"  {results[-1]}", flush=True)
    return results


def rate(report: Any) -> float:
    """Offsets consumed per second of a run: rows landed and late copies skipped."""
    return float(report.records + report.skipped) / report.timings_s["total"]


def run_case(
    name: str, case: Routed | None, kafka: Any, catalog: Any, spark: Any, dr_kafka: Any
) -> Any:
    """One engine run of a case: the plain pipeline on dr, or a pipeline on its route."""
    from ingestion.pipeline.run import run_pipeline

    if case is None:
        spec, config = plain_spec("lc_plain", "plain"), dr_kafka.client_config()
        return run_pipeline(spec, config, catalog, spark, dr_kafka.get_cluster_id())
    route = case.route
    return run_pipeline(
        route.spec,
        route.kafka.client_config(),
        catalog,
        spark,
        route.kafka.get_cluster_id(),
        cluster=route.cluster,
        cluster_config=lambda cluster: kafka.for_cluster(cluster).client_config(),
    )


def check_table(
    catalog: Any,
    name: str,
    case: Routed | None,
    records: int,
    repeats: int,
    noted: list[tuple[str, int, int]],
) -> str:
    """'ok', or what the table read back shows wrong."""
    from ingestion.table.offsets import skipped_offsets

    if case is None:
        table = catalog.load_table(plain_spec("lc_plain", "plain").table)
        rows = table.scan(selected_fields=("_kafka_offset",)).to_arrow().num_rows
        return "ok" if rows == records * repeats else f"{rows} rows, {records * repeats} expected"
    table = catalog.load_table(case.spec.table)
    fields = ("_kafka_topic", "_kafka_partition", "_kafka_offset")
    arrow = table.scan(selected_fields=fields).to_arrow()
    landed = set(zip(*(arrow.column(f).to_pylist() for f in fields), strict=True))
    copy = case.route.spec.source_topics[0]
    mine = noted if name == "late_copies" else []
    near = {(copy, p, o) for tag, p, o in mine if tag == "near"}
    late = {(copy, p, o) for tag, p, o in mine if tag == "late"}
    expected = case.head + len(case.originals) + records * repeats + len(near)
    problems = []
    if arrow.num_rows != expected or len(landed) != arrow.num_rows:
        problems.append(f"{arrow.num_rows} rows ({len(landed)} distinct), {expected} expected")
    if late & landed or not near <= landed:
        problems.append(f"{len(late & landed)} late copies landed, near misses {near - landed}")
    if skipped_offsets(table) != late:
        problems.append(f"{len(skipped_offsets(table))} skips recorded, {len(late)} made")
    return "; ".join(problems) or "ok"


def print_late_copy_table(results: list[dict[str, Any]]) -> bool:
    """Print the table (each case's median ratio to ``plain``); return whether every count is
    exact."""
    print(
        f"\n{'case':<16}{'uncopied':>9}{'rows':>9}{'skipped':>8}{'seconds':>9}{'rec/s':>9}"
        f"{'x plain':>8}  check"
    )
    ok = True
    for r in results:
        exact = r["runs_exact"] and r["read_back"] == "ok"
        ok = ok and exact
        verdict = "ok" if exact else f"COUNT-MISMATCH {r['read_back']}"
        print(
            f"{r['case']:<16}{r['uncopied']:>9}{r['records']:>9}{r['late_copies']:>8}"
            f"{r['seconds']:>9}{r['records_per_s']:>9}{r['ratio']:>8.2f}"
            f"  {verdict}"
        )
    return ok
