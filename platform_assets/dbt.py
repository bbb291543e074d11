"""dbt models as assets downstream of the Iceberg tables they read; dbt tests as asset checks.

The manifest is prepared at load time when it is missing (``make`` prepares it beforehand) and
under ``dagster dev``. Models refresh themselves after new commits to their upstream table
(``AutomationCondition.eager()``: it waits for in-flight runs, so runs never pile up), one dbt
run at a time (the ``dbt_duckdb`` pool: DuckDB has a single writer).
"""

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from dagster import AssetExecutionContext, AutomationCondition
from dagster_dbt import (
    DagsterDbtTranslator,
    DagsterDbtTranslatorSettings,
    DbtCliResource,
    DbtProject,
    dbt_assets,
)

DBT_PROJECT_DIR = Path(__file__).resolve().parent.parent / "dbt"


def load_dbt_project() -> DbtProject:
    """The dbt project, with its manifest prepared if it is missing."""
    project = DbtProject(project_dir=DBT_PROJECT_DIR, profiles_dir=DBT_PROJECT_DIR)
    if not project.manifest_path.exists():
        project.preparer.prepare(project)
    else:
        project.prepare_if_dev()
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
    executable = Path(sys.executable).with_name("dbt")  # this environment's dbt, PATH or not
    return DbtCliResource(
        project_dir=project, profiles_dir=str(DBT_PROJECT_DIR), dbt_executable=str(executable)
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
