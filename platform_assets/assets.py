"""Assets built from the pipeline specs: one external asset per Kafka topic."""

from __future__ import annotations

from datetime import UTC, datetime

from dagster import AssetKey, AssetObservation, AssetSpec, MetadataValue

from ingestion.spec import PipelineSpec
from ingestion.topics import (
    TopicState,
    describe_topic,
    list_matching_topics,
    read_newest_timestamp_ms,
)
from platform_assets.pipelines import topic_asset_keys
from resources.kafka import KafkaResource


def topic_metadata(states: list[TopicState], newest_ms: int | None) -> dict[str, MetadataValue]:
    """Return the observation metadata of one topic asset (numbers typed for the UI's plots)."""
    metadata: dict[str, MetadataValue] = {
        "topics": MetadataValue.json({s.topic: s.topic_id for s in states}),
        "partitions": MetadataValue.int(sum(len(s.partitions) for s in states)),
        "end_offsets_total": MetadataValue.int(sum(sum(s.end_offsets.values()) for s in states)),
        "records_in_log": MetadataValue.int(sum(s.record_span for s in states)),
        "end_offsets": MetadataValue.json(
            {
                f"{s.topic}:{p.partition}": {"log_start": p.log_start_offset, "end": p.end_offset}
                for s in states
                for p in s.partitions
            }
        ),
    }
    if newest_ms is not None:
        metadata["newest_record_time"] = MetadataValue.timestamp(
            datetime.fromtimestamp(newest_ms / 1000, tz=UTC)
        )
    return metadata


def build_topic_spec(spec: PipelineSpec, key: AssetKey) -> AssetSpec:
    """Return the external asset of one topic (or of a pattern pipeline's topics)."""
    source = f"pattern {spec.topic_pattern!r}" if spec.topic_pattern else f"topic {key.path[-1]!r}"
    return AssetSpec(
        key=key,
        group_name="kafka",
        kinds={"kafka"},
        description=f"Kafka {source}, read by pipeline {spec.name!r}. Observed by observe_topics.",
        metadata={"pipeline": spec.name, "consumer_group_id": spec.consumer_group_id},
    )


def observe_topic(kafka: KafkaResource, spec: PipelineSpec, key: AssetKey) -> AssetObservation:
    """Read the topic's partitions, end offsets and newest record time; join no group."""
    admin = kafka.get_admin_client()
    if spec.topic_pattern:
        topics = list_matching_topics(admin, spec.topic_pattern)
    else:
        topics = [key.path[-1]]
    consumer = kafka.get_consumer()
    try:
        states = [describe_topic(admin, consumer, topic) for topic in topics]
        newest = [read_newest_timestamp_ms(consumer, state) for state in states]
    finally:
        consumer.close()
    newest_ms = max((ms for ms in newest if ms is not None), default=None)
    return AssetObservation(asset_key=key, metadata=topic_metadata(states, newest_ms))


def build_pipeline_assets(spec: PipelineSpec) -> list[AssetSpec]:
    """Return every asset of one pipeline."""
    return [build_topic_spec(spec, key) for key in topic_asset_keys(spec)]
