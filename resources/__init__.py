"""Dagster resources: typed configuration turned into client objects, nothing more.

One module per system: :mod:`resources.kafka`, :mod:`resources.iceberg`, :mod:`resources.spark`,
and :mod:`resources.embedded` for the local broker process used by ``make dev`` and the tests.
"""
