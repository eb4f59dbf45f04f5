"""The daemon process: the Manager, its seats, delivery, and the cut and resume handshakes."""
