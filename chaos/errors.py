"""Expected failures of chaos runs, each with a message a person can act on."""

from __future__ import annotations


class ChaosError(Exception):
    """Base of every error the chaos package raises on purpose."""


class DrillError(ChaosError):
    """A drill cannot run (no cluster, not in controller mode, no master to kill)."""


class NemesisError(ChaosError):
    """A fault cannot be started (no such kind or target, a proxied fault on an unproxied cluster)."""


class RunError(ChaosError):
    """A chaos run cannot start or go on (no cluster, not in controller mode, no master)."""
