"""The Dagster surface of the platform, built from the pipeline specs in ``pipelines.yaml``."""
