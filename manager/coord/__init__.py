"""The coordinators: the cut, the restore, the move, the verification and the pack, as a library.

Each takes a typed request (`manager/coord/requests.py`) and returns its result; none parses an
argument or prints a result. The CLI (`manager/cli`) parses a command line into a request and
prints what comes back; the daemon (`manager/daemon/mover.py`) calls the restore coordinator
in-process for a move's destination, so the daemon never runs the CLI. What a coordinator says
while it works goes through `manager/coord/report.py`: the CLI's stderr, or the daemon's log.
"""
