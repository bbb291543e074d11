"""Exceptions raised by the ingestion engine, one per named failure."""

from __future__ import annotations


class IngestionError(Exception):
    """Base class of every error the engine raises on purpose."""


class PipelineSpecError(IngestionError, ValueError):
    """A pipeline spec is invalid; the message names the pipeline and the key."""


class TopicNotFoundError(IngestionError):
    """A topic the pipeline reads, or read before, does not exist on the cluster."""


class PartitionVanishedError(IngestionError):
    """A partition that holds committed offsets no longer exists."""


class TopicRecreatedError(IngestionError):
    """The topic id differs from the one stored with the offsets: deleted and recreated."""


class ClusterChangedError(IngestionError):
    """The Kafka cluster id differs from the one stored with the offsets."""


class RouteClusterError(IngestionError):
    """A run was told it reads another cluster than the one the table's route reads."""


class OffsetOutOfRangeError(IngestionError):
    """A committed offset is above the partition's end offset (log truncated or recreated)."""


class DataLossError(IngestionError):
    """A start offset is below the log start offset: records were deleted before being read."""


class MissingOffsetsError(IngestionError):
    """The table holds data but no offsets for this group (never restart from earliest)."""


class GroupMismatchError(MissingOffsetsError):
    """The table holds offsets only under other group ids."""


class RetiredGroupError(GroupMismatchError):
    """The group id was retired by a group migration: its offsets in the table are stale."""


class TableDroppedError(IngestionError):
    """The target table was dropped, or recreated under another UUID, during the run."""


class CommitConflictError(IngestionError):
    """Another commit moved this group's offsets since the plan; this attempt was aborted."""


class QuarantineSyncError(IngestionError):
    """The quarantine table could not be brought up to the data table's commits."""


class OffsetRegressionError(IngestionError):
    """A commit would move an offset backwards or drop a partition from the offsets."""


class CommitOutcomeUnknownError(IngestionError):
    """The catalog call failed ambiguously and reconciliation could not find the commit."""


class UpsertPlanError(IngestionError):
    """A ``mode: upsert`` batch could not be planned against the table (a delete file the
    copy-on-write cannot read, a key value it cannot compare); nothing was committed."""


class DecodeError(IngestionError):
    """A record could not be decoded and ``errors_tolerance`` is ``none``."""


class ReadError(IngestionError):
    """A task could not read its planned range (offsets gone, timeout, broker error)."""


class TaskFailedError(IngestionError):
    """A Spark task failed (read, decode or write); nothing was committed (R9)."""


class SchemaEvolutionError(IngestionError):
    """New fields could not be added to the table's schema."""


class InjectedFailure(IngestionError):
    """Raised by a failure hook in tests to crash a run at a named point."""


class OrphanRemovalRefusedError(IngestionError):
    """The table's references and the filesystem listing do not match: nothing is deleted."""


class MaintenanceConflictError(IngestionError):
    """A maintenance commit kept losing its compare-and-set against concurrent commits."""


class ReplicaFormatError(IngestionError):
    """A record of a MirrorMaker 2 internal topic is not in MM2's wire format."""


class FailoverRefusedError(IngestionError):
    """A failover cannot place the pipeline on the replica without a loss or a duplicate."""


class ReplicaBehindError(FailoverRefusedError):
    """The table holds records the replica has no copy of yet (MM2 is behind the table)."""


class OperationRefusedError(IngestionError):
    """An operator action does not apply to the pipeline's current state; nothing changed."""


class AmbiguousRewindError(IngestionError):
    """A backward reset would delete rows of two topics with one name (read on two clusters)."""


class EngineMismatchError(IngestionError):
    """A Spark executor runs another version of the engine than the run's driver."""


class LateCopyUnverifiedError(IngestionError):
    """A record may be MM2's late copy of one the table holds, and its source does not answer."""


class DeadLetterTopicError(IngestionError):
    """The pipeline's dead-letter topic does not exist and could not be created."""
