"""The CLI process: argument parsing, output, and the coordinators of multi-step work."""

from manager.cli.main import main

__all__ = ["main"]
