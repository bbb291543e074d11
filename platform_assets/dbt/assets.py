"""dbt models as assets downstream of the Iceberg tables they read; dbt tests as asset checks.

The manifest is prepared at load time when it is missing (``make`` prepares it beforehand) and
under ``dagster dev``. Models refresh themselves after new commits to their upstream table
(``AutomationCondition.eager()``: it waits for in-flight runs, so runs never pile up, and for
the table's first materialization, so no build runs before the table exists; ``make dev``
wipes the assets' history with the demo catalog for that reason, scripts/dev.py), one dbt run
at a time (the ``dbt_duckdb`` pool: DuckDB has a single writer).
"""

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetSelection,
    AutomationCondition,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
)
from dagster_dbt import (
    DagsterDbtTranslator,
    DagsterDbtTranslatorSettings,
    DbtCliResource,
    DbtProject,
    dbt_assets,
)

DBT_PROJECT_DIR = Path(__file__).resolve().parents[2] / "dbt"


def load_dbt_project() -> DbtProject:
    """The dbt project, with its manifest prepared (``dbt parse``) if it is missing.

    ``make`` prepares the manifest beforehand; dagster-dbt's own ``prepare_if_dev`` is not used
    because it looks for ``dbt`` on PATH, which a non-activated virtualenv does not provide.
    """
    project = DbtProject(project_dir=DBT_PROJECT_DIR, profiles_dir=DBT_PROJECT_DIR)
    if not project.manifest_path.exists():
        dbt_resource(project).cli(["parse"], target_path=project.target_path).wait()
    return project


class PlatformDbtTranslator(DagsterDbtTranslator):
    """Models in the ``analytics`` group, refreshed eagerly after their upstream commits."""

    def get_group_name(self, dbt_resource_props: Mapping[str, Any]) -> str | None:
        return "analytics" if dbt_resource_props["resource_type"] == "model" else None

    def get_automation_condition(
        self, dbt_resource_props: Mapping[str, Any]
    ) -> AutomationCondition | None:
        return AutomationCondition.eager()


def dbt_resource(project: DbtProject) -> DbtCliResource:
    """The dbt CLI resource for the project (profiles in ``dbt/profiles.yml``)."""
    local = Path(sys.executable).with_name("dbt")  # this environment's dbt, on PATH or not
    return DbtCliResource(
        project_dir=project,
        profiles_dir=str(DBT_PROJECT_DIR),
        dbt_executable=str(local) if local.exists() else "dbt",
    )


def build_dbt_automation_sensor() -> AutomationConditionSensorDefinition:
    """Evaluates the models' eager conditions; on by default (Dagster's own default sensor
    for automation conditions starts off and must be toggled in the UI)."""
    return AutomationConditionSensorDefinition(
        "analytics_automation",
        target=AssetSelection.groups("analytics"),
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=30,
    )


def build_dbt_assets(project: DbtProject) -> Any:
    """The project's models as assets and its tests as asset checks."""
    translator = PlatformDbtTranslator(
        settings=DagsterDbtTranslatorSettings(enable_asset_checks=True)
    )

    @dbt_assets(
        manifest=project.manifest_path, dagster_dbt_translator=translator, pool="dbt_duckdb"
    )
    def analytics(context: AssetExecutionContext, dbt: DbtCliResource) -> Iterator[Any]:
        yield from dbt.cli(["build"], context=context).stream()

    return analytics
