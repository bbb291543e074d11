"""Resource wiring for the code location: every resource from the one configuration.

The configuration is the YAML file named by ``$PLATFORM_CONFIG`` (``resources.config``), read
when the code location loads (every *Reload definitions*), never at import; without it, the
embedded stack's defaults. ``make dev`` and the tests use those defaults, which refer to
``KAFKA_BOOTSTRAP_SERVERS``, ``PLATFORM_STATE_DIR`` and the optional alert variables
(``PLATFORM_ALERT_WEBHOOK_URL``, ``PLATFORM_SLACK_TOKEN``, ``PLATFORM_UI_BASE_URL``).
A deployment writes its own file (docs/production.md); no code changes.
"""

from typing import Any

from resources.config import PlatformConfig, load_config
from resources.factory import build_resources as resources_from_config


def build_resources(config: PlatformConfig | None = None) -> dict[str, Any]:
    """Return the resources every asset, check and sensor uses, from ``config`` (default:
    :func:`resources.config.load_config`). Secrets stay ``${NAME}`` references in them."""
    return resources_from_config(config or load_config())
