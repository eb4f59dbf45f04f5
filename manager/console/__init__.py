"""`cotal console`: a live view of the fleet, in a terminal or served on loopback.

`model.py` turns what the CLI's readers return (the `fleet` and `ps` ops' rows, the lifecycle
events of `cotal events --fleet`) into what is drawn, and is pure; `feed.py` fetches those and
runs the seat verbs through the CLI's own client code; `app.py` is the textual app; `web.py`
serves the same app with textual-serve on a loopback address. Nothing here is imported by
another command: `manager/cli/console.py` imports it inside its handler, so only the console
pays for textual.
"""
