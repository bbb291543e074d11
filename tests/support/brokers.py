"""What the tests' embedded brokers share."""

BROKER_STOP_S = 0.5
"""How long a test broker gets to exit on SIGTERM before SIGKILL (``stop_timeout_s``). On
SIGTERM Kafka shuts down in a controlled way (seconds, more while clients are connected); the
tests' brokers and their storage are thrown away, so nothing is lost by not waiting."""
