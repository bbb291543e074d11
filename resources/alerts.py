"""Alert sinks: the log (always), a JSON webhook, and Slack through dagster-slack."""

from __future__ import annotations

import json
import logging
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from dagster import ConfigurableResource
from pydantic import ConfigDict, Field

LOGGER = logging.getLogger("platform.alerts")


@dataclass(frozen=True)
class Alert:
    """One alert: a failed check or run, or the recovery of a check."""

    kind: Literal["check_failed", "check_recovered", "run_failed"]
    title: str
    message: str
    severity: str = "ERROR"
    details: dict[str, Any] = field(default_factory=dict)

    def to_text(self) -> str:
        """One human line (Slack, logs)."""
        icon = {
            "check_failed": "FAILED",
            "check_recovered": "RECOVERED",
            "run_failed": "RUN FAILED",
        }
        return f"[{icon[self.kind]}] {self.title}: {self.message}"


class AlertResource(ConfigurableResource):
    """Where alerts go. The log always; a webhook and Slack when configured (empty = off).

    Give ``webhook_url`` and ``slack_token`` as ``EnvVar`` in a deployment; they never reach
    logs or metadata.
    """

    model_config = ConfigDict(extra="forbid")  # a misspelt setting fails at load

    webhook_url: str = Field(default="", description="POST target for JSON alerts; '' = off.")
    slack_token: str = Field(default="", description="Slack bot token; '' = off.")
    slack_channel: str = Field(default="#data-alerts", description="Slack channel for alerts.")
    timeout_s: float = Field(default=10.0, description="Timeout of one webhook or Slack call.")

    def send(self, alert: Alert) -> list[str]:
        """Send ``alert`` to every configured sink; return the sinks that accepted it.

        A failing sink is logged and does not stop the others.
        """
        delivered = ["log"]
        LOGGER.warning(alert.to_text())
        if self.webhook_url:
            try:
                self._post_webhook(alert)
                delivered.append("webhook")
            except OSError as exc:
                LOGGER.error("alert webhook failed: %s", exc)
        if self.slack_token:
            try:
                from dagster_slack import SlackResource

                client = SlackResource(token=self.slack_token).get_client()
                client.chat_postMessage(channel=self.slack_channel, text=alert.to_text())
                delivered.append("slack")
            except Exception as exc:  # the Slack SDK raises its own error types
                LOGGER.error("alert to Slack failed: %s", type(exc).__name__)
        return delivered

    def _post_webhook(self, alert: Alert) -> None:
        if not self.webhook_url.startswith(("http://", "https://")):
            raise OSError(f"webhook_url must be http(s), got scheme of {self.webhook_url[:8]!r}")
        request = urllib.request.Request(  # noqa: S310 - scheme checked above
            self.webhook_url,
            data=json.dumps(asdict(alert), default=str).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
            response.read()
