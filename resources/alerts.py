"""Alert sinks: the log (always), a JSON webhook, and Slack through dagster-slack."""

from __future__ import annotations

import json
import logging
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from dagster import ConfigurableResource
from pydantic import ConfigDict, Field

from resources.secrets import resolve

LOGGER = logging.getLogger("platform.alerts")

AlertKind = Literal[
    "check_failed",
    "check_recovered",
    "check_still_failing",
    "run_failed",
    "stream_failed",
    "state_unreadable",
]
LABELS: dict[str, str] = {
    "check_failed": "FAILED",
    "check_recovered": "RECOVERED",
    "check_still_failing": "STILL FAILING",
    "run_failed": "RUN FAILED",
    "stream_failed": "STREAM FAILED",
    "state_unreadable": "STATE UNREADABLE",
}


@dataclass(frozen=True)
class Alert:
    """One alert: a check that starts failing, still fails, or passes again; or a failed run.

    ``title`` names the pipeline and the check (or run), ``message`` the cause and the fix,
    ``link`` the page in the Dagster UI ('' when no UI address is configured).
    """

    kind: AlertKind
    title: str
    message: str
    severity: str = "ERROR"
    details: dict[str, Any] = field(default_factory=dict)
    link: str = ""

    def to_text(self) -> str:
        """One human line (Slack, logs).

        Example:
            >>> Alert("check_recovered", "pipeline 'p', check c on t", "ok", "INFO").to_text()
            "[RECOVERED] pipeline 'p', check c on t: ok"
        """
        text = f"[{LABELS[self.kind]}] {self.title}: {self.message}"
        return f"{text.rstrip('.')}. See {self.link}" if self.link else text


class AlertResource(ConfigurableResource):
    """Where alerts go. The log always; a webhook and Slack when configured (empty = off).

    Give ``webhook_url`` and ``slack_token`` as ``${NAME}`` references (resolved when an alert
    is sent) or ``EnvVar``; they never reach logs or metadata.
    """

    model_config = ConfigDict(extra="forbid")  # a misspelt setting fails at load

    webhook_url: str = Field(default="", description="POST target for JSON alerts; '' = off.")
    slack_token: str = Field(default="", description="Slack bot token; '' = off.")
    slack_channel: str = Field(default="#data-alerts", description="Slack channel for alerts.")
    timeout_s: float = Field(default=10.0, description="Timeout of one webhook or Slack call.")
    ui_base_url: str = Field(
        default="",
        description="Dagster UI address (e.g. http://127.0.0.1:3000); alerts link to the "
        "asset's checks or the run there. '' = no links.",
    )
    reminder_hours: float = Field(
        default=6.0,
        ge=0,
        description="Re-send a check that is still failing every this many hours; 0 = never.",
    )

    def asset_link(self, path: Sequence[str], check_name: str = "") -> str:
        """The asset's Checks tab (``check_name`` opened) in the UI; '' without a UI address.

        Example:
            >>> AlertResource(ui_base_url="http://ui:3000/").asset_link(["iceberg", "t"], "c")
            'http://ui:3000/assets/iceberg/t?view=checks&checkDetail=c'
        """
        base = self._base_url()
        if not base:
            return ""
        query = {"view": "checks", **({"checkDetail": check_name} if check_name else {})}
        quoted = "/".join(urllib.parse.quote(part, safe="") for part in path)
        return f"{base}/assets/{quoted}?{urllib.parse.urlencode(query)}"

    def run_link(self, run_id: str) -> str:
        """The run's page in the UI; '' without a UI address."""
        base = self._base_url()
        return f"{base}/runs/{run_id}" if base else ""

    def _base_url(self) -> str:
        return resolve(self.ui_base_url, "alerts.ui_base_url").rstrip("/")

    def send(self, alert: Alert) -> list[str]:
        """Send ``alert`` to every configured sink; return the sinks that accepted it.

        A failing sink is logged and does not stop the others.
        """
        delivered = ["log"]
        LOGGER.warning(alert.to_text())
        webhook_url = resolve(self.webhook_url, "alerts.webhook_url")
        slack_token = resolve(self.slack_token, "alerts.slack_token")
        if webhook_url:
            try:
                self._post_webhook(alert, webhook_url)
                delivered.append("webhook")
            except OSError as exc:
                LOGGER.error("alert webhook failed: %s", exc)
        if slack_token:
            try:
                from dagster_slack import SlackResource

                client = SlackResource(token=slack_token).get_client()
                client.chat_postMessage(channel=self.slack_channel, text=alert.to_text())
                delivered.append("slack")
            except Exception as exc:  # the Slack SDK raises its own error types
                LOGGER.error("alert to Slack failed: %s", type(exc).__name__)
        return delivered

    def _post_webhook(self, alert: Alert, webhook_url: str) -> None:
        if not webhook_url.startswith(("http://", "https://")):
            raise OSError(f"webhook_url must be http(s), got scheme of {webhook_url[:8]!r}")
        body = {**asdict(alert), "text": alert.to_text()}
        request = urllib.request.Request(  # noqa: S310 - scheme checked above
            webhook_url,
            data=json.dumps(body, default=str).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
            response.read()
