"""Fault injection and recovery: heartbeats, Tier 1 in-place restarts, Tier 2 global restarts, redelivery."""
