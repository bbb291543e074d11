"""What the tests' embedded brokers share."""

BROKER_STOP_S = 0.5
"""How long a test broker gets to exit on SIGTERM before SIGKILL (``stop_timeout_s``). Tansu
waits for its clients to hang up, and an admin client or a producer still open made every stop
wait out the 5 s default; the tests' brokers keep data in memory only and are thrown away, so
nothing is lost by not waiting."""
