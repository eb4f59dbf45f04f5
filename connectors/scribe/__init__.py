"""The scribe connector (`connector.py`: launches and drives it) and the built-in offline harness
itself (`harness.py`, run as `python -m connectors.scribe`).

Empty on purpose: the harness process imports this package before its own module, and the
connector's imports (the driver and launch kits, the harness pins) are the manager's, not the
seat's. A scribe seat's start was two thirds those imports.
"""
