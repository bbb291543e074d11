"""One exception per named failure, in one hierarchy: callers catch ``IngestionError`` for any
of them, the specialised ones are caught by their general kind, and each is named so that a
Spark task's failure text can be traced back to it (``ingestion.pipeline.execute``)."""

from __future__ import annotations

import inspect
import pickle

import pytest

from ingestion import exceptions
from ingestion.pipeline.execute import task_failure_message

ALL = [
    cls
    for _, cls in inspect.getmembers(exceptions, inspect.isclass)
    if cls.__module__ == exceptions.__name__
]


def test_the_module_defines_its_failures() -> None:
    assert len(ALL) > 30
    assert exceptions.IngestionError in ALL


@pytest.mark.parametrize("cls", ALL, ids=lambda cls: cls.__name__)
def test_every_failure_is_an_ingestion_error_with_a_docstring(cls: type[Exception]) -> None:
    assert issubclass(cls, exceptions.IngestionError)
    assert (cls.__doc__ or "").strip(), f"{cls.__name__} says nothing of when it is raised"


@pytest.mark.parametrize("cls", ALL, ids=lambda cls: cls.__name__)
def test_a_spark_tasks_failure_text_is_traced_to_each_failure(cls: type[Exception]) -> None:
    """A task's exception reaches the driver as text; its line names the failure."""
    text = f"Traceback (most recent call last):\n  ...\n{cls.__module__}.{cls.__name__}: boom\n"
    assert task_failure_message("p", RuntimeError(text)).endswith(
        f"nothing was committed: {cls.__module__}.{cls.__name__}: boom"
    )


@pytest.mark.parametrize("cls", ALL, ids=lambda cls: cls.__name__)
def test_every_failure_survives_pickling_with_its_message(cls: type[Exception]) -> None:
    raised = pickle.loads(pickle.dumps(cls("pipeline 'p': what happened")))
    assert type(raised) is cls
    assert str(raised) == "pipeline 'p': what happened"


@pytest.mark.parametrize(
    ("specific", "general"),
    [
        (exceptions.PipelineSpecError, ValueError),  # pydantic validators raise it
        (exceptions.GroupMismatchError, exceptions.MissingOffsetsError),
        (exceptions.RetiredGroupError, exceptions.GroupMismatchError),
        (exceptions.ReplicaBehindError, exceptions.FailoverRefusedError),
    ],
)
def test_specialised_failures_are_caught_by_their_general_kind(
    specific: type[Exception], general: type[Exception]
) -> None:
    with pytest.raises(general):
        raise specific("x")
