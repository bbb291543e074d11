"""A `make dev` restart (scripts/dev.py ``prepare_state``): the demo's data, the dbt models
built from it and the assets' history of it are reset together, so the models' ``eager``
condition waits for the new table's first commit instead of building on a source that does not
exist yet, and ``orders_incremental`` starts again from the new session's records.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetSelection,
    AssetSpec,
    DagsterInstance,
    Definitions,
    evaluate_automation_conditions,
)

from platform_assets.dbt.assets import build_dbt_assets, dbt_resource, load_dbt_project
from tests.support.scripts import load_script

TABLE = AssetKey(["iceberg", "demo", "orders"])
MODELS = {AssetKey([name]) for name in ("stg_orders", "orders_incremental", "daily_revenue")}
TARGET = AssetSelection.groups("analytics")  # what the analytics_automation sensor evaluates


def load_dev_script() -> ModuleType:
    """scripts/dev.py (a script, not a package module)."""
    return load_script("dev", "dev_script")


def test_restart_resets_the_models_and_waits_for_the_new_table(tmp_path: Path) -> None:
    dev = load_dev_script()
    prepare_state, reset = dev.prepare_state, dev.RESET
    project = load_dbt_project()
    defs = Definitions(
        assets=[AssetSpec(TABLE), build_dbt_assets(project)],
        resources={"dbt": dbt_resource(project)},
    )
    home = prepare_state(tmp_path)  # the first start: a new DAGSTER_HOME
    with DagsterInstance.from_config(str(home)) as instance:
        # The last session: a commit, the models built on it, one more commit, then Ctrl-C
        # before the automation sensor's next tick.
        instance.report_runless_asset_event(AssetMaterialization(TABLE))
        cursor = evaluate_automation_conditions(defs, instance, TARGET).cursor
        for model in MODELS:
            instance.report_runless_asset_event(AssetMaterialization(model))
        cursor = evaluate_automation_conditions(defs, instance, TARGET, cursor=cursor).cursor
        instance.report_runless_asset_event(AssetMaterialization(TABLE))
    for name in reset[:3]:  # what the last session left under the state folder
        (tmp_path / name).touch()

    assert prepare_state(tmp_path) == home  # the restart
    assert not [name for name in reset if (tmp_path / name).exists()]
    with DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_latest_materialization_event(TABLE) is None
        # The new table does not exist yet: the models wait (kept, the last session's history
        # would have started a build here, failing on the missing source).
        result = evaluate_automation_conditions(defs, instance, TARGET, cursor=cursor)
        assert result.total_requested == 0
        # The new session's first commit: now they build, all three, once.
        instance.report_runless_asset_event(AssetMaterialization(TABLE))
        result = evaluate_automation_conditions(defs, instance, TARGET, cursor=result.cursor)
        assert {key for key in MODELS if result.get_num_requested(key)} == MODELS
        result = evaluate_automation_conditions(defs, instance, TARGET, cursor=result.cursor)
        assert result.total_requested == 0
