"""The node process: client protocol server, request handlers, role state machine, replication
runtime, controller agent wiring, metrics and the dispatch loop. ``serve_node`` (node.py)
composes them; ``hastore node start`` (cli.py) runs it.

Nothing here is imported by the client library.
"""
