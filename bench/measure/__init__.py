"""Measurement: memory and latency of a deployed model (latency), what bounds it on this machine (bandwidth), and a
run's cost estimated from the config alone (costs)."""
