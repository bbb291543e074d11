"""The exactly-once Kafka -> Iceberg ingestion engine. Imports no Dagster.

A run is a two-phase commit: plan (driver) -> read, decode and write data files (Spark
executors) -> commit one Iceberg snapshot that carries the next offsets (driver) -> mirror the
offsets to the Kafka consumer group (best effort). See docs/reliability.md.
"""
