"""Harness connectors: what a seat's program is, how it is launched and how it is driven."""
