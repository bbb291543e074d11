"""scripts/dev_chaos.py is run by hand (a 15-minute `make dev` run with real MirrorMaker 2,
docs/operate.md); here, cheaply, what it hands the stack: the configuration and pipelines file it
writes validate as the code location loads them, and the group migration's edit names the new
group and changes nothing else, so a drift in the spec's keys fails here, not 10 minutes in."""

from __future__ import annotations

from pathlib import Path

from ingestion.spec.pipeline import load_pipeline_specs
from resources.config import load_config
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_the_chaos_configuration_validates_and_the_migration_edit_names_the_new_group(
    tmp_path: Path,
) -> None:
    chaos = load_script("dev_chaos")
    config = load_config(chaos.write_config(tmp_path, "127.0.0.1:1"))
    assert config.replicas["dr"].bootstrap_servers == "127.0.0.1:1"
    (spec,) = load_pipeline_specs(Path(config.pipelines_file))
    (shipped,) = load_pipeline_specs(ROOT / "platform_assets" / "pipelines.yaml")
    assert spec.dead_letter_topic == chaos.DEAD_LETTERS
    assert [r.name for r in spec.replicas] == ["dr"]
    assert spec.freshness_target_seconds == shipped.freshness_target_seconds  # still a stream

    chaos.use_group(tmp_path, chaos.NEW_GROUP)
    (moved,) = load_pipeline_specs(Path(config.pipelines_file))
    assert moved.consumer_group_id == chaos.NEW_GROUP
    assert moved.model_copy(update={"consumer_group_id": spec.consumer_group_id}) == spec
