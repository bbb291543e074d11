"""Exceptions raised by the ingestion engine, one per named failure."""

from __future__ import annotations


class IngestionError(Exception):
    """Base class of every error the engine raises on purpose."""


class PipelineSpecError(IngestionError, ValueError):
    """A pipeline spec is invalid; the message names the pipeline and the key."""


class TopicNotFoundError(IngestionError):
    """A topic the pipeline reads does not exist on the cluster."""
