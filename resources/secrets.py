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


def is_reference(value: str) -> bool:
    """Whether ``value`` is exactly one ``${NAME}`` reference (a secret kept out of the file).

    Example:
        >>> is_reference("${KAFKA_SASL_PASSWORD}"), is_reference("hunter2")
        (True, False)
    """
    return REFERENCE.fullmatch(value.strip()) is not None
