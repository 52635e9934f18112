"""``hastore chaos toxiproxy serve``: run the Toxiproxy-compatible server in the foreground.

    hastore chaos toxiproxy serve [--host 127.0.0.1] [--port 8474] [--seed N]

It prints one line, ``toxiproxy API listening on http://HOST:PORT``, once it listens (with
``--port 0`` that is how a caller learns the port), and stops cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import signal
import sys
from functools import partial

import click
import trio

from .errors import ToxiproxyStartError
from .server import DEFAULT_HOST, DEFAULT_PORT, serve_toxiproxy


@click.group("toxiproxy")
def toxiproxy_group() -> None:
    """A Toxiproxy-compatible server (Shopify Toxiproxy 2.x REST API) for network fault injection."""


@toxiproxy_group.command("serve")
@click.option("--host", default=DEFAULT_HOST, show_default=True, help="Address of the REST API.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535),
              help="Port of the REST API (0: a free one, printed on start).")
@click.option("--seed", default=None, type=int, help="Seed of the random draws (toxicity, jitter, slice sizes).")
def serve_command(host: str, port: int, seed: int | None) -> None:
    """Serve the Toxiproxy REST API until SIGTERM or SIGINT.

    Drive it with any Toxiproxy client (toxiproxy-python, toxiproxy-cli, curl): create proxies
    with POST /proxies, add toxics (latency, bandwidth, slow_close, timeout, reset_peer,
    slicer, limit_data) with POST /proxies/NAME/toxics, take a proxy down with
    POST /proxies/NAME {"enabled": false}, undo everything with POST /reset.
    """
    try:
        trio.run(partial(_serve_until_signal, host, port, seed))
    except ToxiproxyStartError as error:
        raise click.ClickException(str(error)) from None


async def _serve_until_signal(host: str, port: int, seed: int | None) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            address = await nursery.start(partial(serve_toxiproxy, host, port, seed=seed))
            click.echo(f"toxiproxy API listening on {address.url}")
            sys.stdout.flush()
            async for signum in signals:
                click.echo(f"toxiproxy: {signal.Signals(signum).name}, stopping", err=True)
                nursery.cancel_scope.cancel()
                break
