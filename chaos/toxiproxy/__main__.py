"""``python -m chaos.toxiproxy serve ...``: the ``hastore chaos toxiproxy`` commands without the
``hastore`` entry point (how ``toxiproxy_subprocess`` starts a server)."""

from .cli import toxiproxy_group

toxiproxy_group(prog_name="python -m chaos.toxiproxy")
