"""Expected failures of the pipeline, each with a message a person can act on."""

from __future__ import annotations


class PipelineError(Exception):
    """Base of every error the pipeline package raises on purpose."""


class NotAStoreError(PipelineError):
    """A path given as a store directory is missing or holds no CommitLog."""


class CorruptLogError(PipelineError):
    """A corrupt or truncated record was found while reading with mode=FAILFAST."""


class OptionError(PipelineError):
    """A data source option or job argument has a value that cannot be used."""


class InputFormatError(PipelineError):
    """An input file (a chaos history, lag samples) is not in a format the job reads."""


class SinkError(PipelineError):
    """Messages written through the hastore sink were not all acknowledged."""


class StreamSourceError(PipelineError):
    """The hastore streaming source cannot go on (lost offsets under failOnDataLoss, no route)."""
