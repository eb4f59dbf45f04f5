"""The cotal manager daemon and CLI."""
