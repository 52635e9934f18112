"""Expected operating failures of the storage engine, each with a message a person can act on."""


class StoreError(Exception):
    """Base of every error the store raises on purpose."""


class StoreConfigError(StoreError):
    """A StoreConfig value is out of range or inconsistent."""


class StoreClosedError(StoreError):
    """The store is not started, or was shut down."""


class DiskFullError(StoreError):
    """No room on disk for the next segment; nothing partial was written."""


class StoreCorruptError(StoreError):
    """Bytes on disk are not what the store wrote (CRC or layout mismatch)."""


class MessageNotFound(StoreError):
    """No readable message at the given offset or id."""


def exception_leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside ``error``'s (nested) exception groups, in order; ``[error]``
    when it is not a group."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in exception_leaves(inner)]
    return [error]


def invariant(condition: bool, message: str = "invariant broken") -> None:
    """Raise even under ``python -O``: for states the store must never reach."""
    if not condition:
        raise AssertionError(message)
