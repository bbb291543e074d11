"""Reading a pipeline's state for checks, sensors and the CLI, through the resources."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

from ingestion.health.state import PipelineState, read_state
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.route import active_route
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource

if TYPE_CHECKING:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table


class StateReader:
    """Reads the state of many pipelines with one catalog, and one admin client and one
    consumer per cluster, instead of new ones per pipeline: a sensor's pass over every
    pipeline (``platform_assets.ingest.sensors``). Commits nothing; closes its consumers on exit.

    Example:
        >>> kafka = KafkaResource(bootstrap_servers="b:9092")
        >>> with StateReader(kafka, IcebergCatalogResource(state_dir="unused")) as reader:
        ...     reader.clusters()
        []
    """

    def __init__(self, kafka: KafkaResource, iceberg: IcebergCatalogResource) -> None:
        self.kafka, self.iceberg = kafka, iceberg
        self._catalog: Catalog | None = None
        self._clients: dict[str, tuple[AdminClient, Consumer]] = {}

    def __enter__(self) -> StateReader:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        for _, consumer in self._clients.values():
            consumer.close()
        self._clients.clear()

    def clusters(self) -> list[str]:
        """The clusters this reader has clients for (those of the pipelines read so far)."""
        return sorted(self._clients)

    def catalog(self) -> Catalog:
        """The catalog, loaded once."""
        if self._catalog is None:
            self._catalog = self.iceberg.load_catalog()
        return self._catalog

    def read(self, spec: PipelineSpec, with_oldest: bool = False) -> PipelineState:
        """The table's offsets and Kafka's metadata for ``spec`` (with ``with_oldest``, also
        the timestamp of each lagging partition's oldest uncommitted record).

        Read on the pipeline's active route: after a failover, the replica and its topic names.
        """
        return self.read_with_table(spec, with_oldest)[0]

    def read_with_table(
        self, spec: PipelineSpec, with_oldest: bool = False
    ) -> tuple[PipelineState, Table | None]:
        """:meth:`read`, and the table it read from (None when it does not exist), for a
        caller that needs more of it than the state holds (the metrics' commits in a window)."""
        from pyiceberg.exceptions import NoSuchTableError

        route = active_route(spec, self.kafka, self.iceberg)
        try:  # one load: a catalog's table_exists loads the table too (pyiceberg's SqlCatalog)
            table = self.catalog().load_table(spec.table)
        except NoSuchTableError:
            table = None
        admin, consumer = self._clients_of(route.cluster, route.kafka)
        config: dict[str, Any] | None = route.kafka.client_config() if with_oldest else None
        return read_state(route.spec, table, admin, consumer, config), table

    def _clients_of(self, cluster: str, kafka: KafkaResource) -> tuple[AdminClient, Consumer]:
        if cluster not in self._clients:
            self._clients[cluster] = (kafka.get_admin_client(), kafka.get_consumer())
        return self._clients[cluster]


def read_pipeline_state(
    spec: PipelineSpec,
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
    with_oldest: bool = False,
) -> PipelineState:
    """The table's offsets and Kafka's metadata for ``spec`` (with ``with_oldest``, also the
    timestamp of each lagging partition's oldest uncommitted record); commits nothing.

    Read on the pipeline's active route: after a failover, the replica and its topic names.
    """
    with StateReader(kafka, iceberg) as reader:
        return reader.read(spec, with_oldest)
