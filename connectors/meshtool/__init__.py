"""The mesh tool for harnesses that take MCP servers (Claude Code): a stdio MCP server whose
tools `send`, `post`, `history` and `seats` are the seat's mesh calls (docs/mesh.md), each
forwarded to the manager over the seat's mesh socket (`connectors.meshclient`).

Run as `python -I -m connectors.meshtool` (`connectors.interpreter.own_python`), inside the
seat's sandbox, with `COTAL_MESH_DIR` naming the seat's mesh directory.
"""
