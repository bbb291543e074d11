"""Jobs: topic observation (an op job that reports observations of the external topic assets)."""

from dagster import JobDefinition, OpExecutionContext, job, op

from ingestion.spec import PipelineSpec
from platform_assets.assets import observe_topic
from platform_assets.pipelines import topic_asset_keys
from resources.kafka import KafkaResource


def build_observe_topics_job(specs: list[PipelineSpec]) -> JobDefinition:
    """Return the job that observes every pipeline's topics (reads offsets, commits nothing)."""

    @op(name="observe_topic_offsets")
    def _observe(context: OpExecutionContext, kafka: KafkaResource) -> None:
        for spec in specs:
            for key in topic_asset_keys(spec):
                context.log_event(observe_topic(kafka, spec, key))

    @job(name="observe_topics", description="Observe partitions and end offsets of every topic.")
    def _job() -> None:
        _observe()

    return _job
