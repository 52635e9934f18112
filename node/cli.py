"""The ``hastore`` command: one click group assembled from every package's own commands.

Packages declare their commands in pyproject.toml under the ``hastore.commands`` entry-point
group (and benchmarks under ``hastore.bench``), so this module imports none of them
directly: a runtime package never imports chaos or pipeline just to offer a command.
"""

from __future__ import annotations

import logging
import sys
from importlib.metadata import entry_points

import click


class _EntryPointGroup(click.Group):
    """A click group whose subcommands come from an entry-point group, loaded on demand."""

    def __init__(self, *args, entry_point_group: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._entry_point_group = entry_point_group

    def _entry_points(self) -> dict:
        return {ep.name: ep for ep in entry_points(group=self._entry_point_group)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._entry_points()))

    def get_command(self, ctx: click.Context, name: str):
        command = super().get_command(ctx, name)
        if command is not None:
            return command
        entry_point = self._entry_points().get(name)
        return entry_point.load() if entry_point is not None else None


@click.group(cls=_EntryPointGroup, entry_point_group="hastore.commands",
             context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log-level", default="WARNING", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Log level of the store and node internals (logs go to stderr).")
def cli(log_level: str) -> None:
    """hastore: a replicated, highly available message store on RocketMQ's storage design."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@cli.group(cls=_EntryPointGroup, entry_point_group="hastore.bench")
def bench() -> None:
    """Benchmarks. Each prints its figures (JSON with --json) with a floor measured in the same run."""


def main() -> None:
    cli(prog_name="hastore")


if __name__ == "__main__":
    main()
