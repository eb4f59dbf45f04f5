"""Pure records and wire formats shared by the CLI, the daemon and the connectors.

Nothing in this package performs I/O or imports anyio: everything that crosses a process or a
disk boundary is defined here once, with a strict bounded decoder.
"""
