"""``${NAME}`` references in configuration values, resolved from the environment at use time.

The configuration (``resources.config``) and the resources built from it hold references, never
resolved secrets: ``"${KAFKA_SASL_PASSWORD}"`` or, with a default,
``"${PLATFORM_STATE_DIR:-.platform}"``. They are resolved at the moment a client is built
(:func:`resolve`), so a secret never reaches the Dagster resource configuration, a log line,
asset metadata or a snapshot summary.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# Keys whose values are credentials: the configuration refuses literal values for them.
SECRET_KEY = re.compile(
    r"(password|secret|token(?!\.endpoint)|credential(?!s\.source)|user\.info|private|account-key)",
    re.I,
)


class UnresolvedReferenceError(ValueError):
    """A ``${NAME}`` reference whose environment variable is not set and has no default."""

    def __init__(self, key: str, name: str) -> None:
        super().__init__(
            f"configuration key {key!r} refers to the environment variable {name}, which is "
            f"not set: export {name}=... (or give a default: ${{{name}:-value}})"
        )
        self.key = key
        self.name = name


def references(value: str) -> list[str]:
    """The environment variables ``value`` refers to (those without a default).

    Example:
        >>> references("postgresql://u:${PG_PASSWORD}@db/${PG_DB:-iceberg}")
        ['PG_PASSWORD']
    """
    return [m.group(1) for m in REFERENCE.finditer(value) if m.group(2) is None]


def resolve(value: str, key: str = "value", environ: Mapping[str, str] | None = None) -> str:
    """``value`` with every ``${NAME}`` / ``${NAME:-default}`` replaced from the environment.

    Raises:
        UnresolvedReferenceError: a variable without a default is not set (``key`` is named).

    Example:
        >>> resolve("${USER_X:-guest}@${HOST_X}", environ={"HOST_X": "db"})
        'guest@db'
    """
    env = os.environ if environ is None else environ

    def _substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is None:
            raise UnresolvedReferenceError(key, name)
        return default

    return REFERENCE.sub(_substitute, value)


def resolve_all(
    values: Mapping[str, str], prefix: str, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Every value of ``values`` resolved; an error names ``prefix.key``."""
    return {k: resolve(str(v), f"{prefix}.{k}", environ) for k, v in values.items()}


def is_secret_key(key: str) -> bool:
    """Whether ``key`` names a credential, whose value must be a ``${NAME}`` reference.

    Example:
        >>> [is_secret_key(k) for k in ("sasl.password", "basic.auth.user.info", "s3.endpoint")]
        [True, True, False]
        >>> [is_secret_key(k) for k in ("basic.auth.credentials.source", "adls.account-key")]
        [False, True]
    """
    return bool(SECRET_KEY.search(key))


def keeps_secret_out(value: str) -> bool:
    """Whether a credential's ``value`` keeps the secret out of the file: it refers to at least
    one environment variable, and no reference carries a literal default. References may sit
    anywhere inside the value, beside literal text (an OAuth2 client credential
    ``${CLIENT_ID}:${CLIENT_SECRET}``, a header ``Bearer ${TOKEN}``).

    Example:
        >>> keeps_secret_out("${KAFKA_SASL_PASSWORD}"), keeps_secret_out("hunter2")
        (True, False)
        >>> keeps_secret_out("${ID}:${SECRET}"), keeps_secret_out("${TOKEN:-hunter2}")
        (True, False)
        >>> keeps_secret_out("${PLATFORM_SLACK_TOKEN:-}")  # unset means no sink: no secret
        True
    """
    found = list(REFERENCE.finditer(value))
    return bool(found) and all(not m.group(2) for m in found)


REFERENCE_FORMS = (
    'write "${ENV_VAR_NAME}", or references inside the value such as '
    '"${CLIENT_ID}:${CLIENT_SECRET}", and set those variables where the code runs'
)
"""How to write a credential, for the errors that refuse a literal one."""
