"""Error codes and exceptions.

One enum (`ErrorCode`) with Kafka's names and numeric codes, and one exception
class per code, each a subclass of `ExactlyError` with a `retriable` flag.
Protocol outcomes travel as these codes inside responses (docs/design.md, "Errors"); the SDK
raises the matching exception via `for_code(code)`.
"""
from __future__ import annotations

from exactly_wire.error_codes import RETRIABLE, ErrorCode


class ExactlyError(Exception):
    """Base of every SDK error. `code` is the ErrorCode; `retriable` says whether
    the same request may succeed if sent again (after backoff / metadata refresh)."""

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR
    retriable: bool = False

    def __init__(self, message: str | None = None):
        super().__init__(message or self.code.name)
        self.message = message or self.code.name


class KafkaTimeoutError(ExactlyError):
    """A client-side wait (flush, commit, init) ran out of time."""
    code = ErrorCode.REQUEST_TIMED_OUT
    retriable = True


class IllegalStateError(ExactlyError):
    """An SDK method was called in a state that does not allow it
    (e.g. commit_transaction without begin_transaction)."""
    code = ErrorCode.INVALID_TXN_STATE


def _class_name(code: ErrorCode) -> str:
    special = {
        ErrorCode.PRODUCER_FENCED: "ProducerFencedError",
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: "UnknownTopicOrPartitionError",
        ErrorCode.TOPIC_ALREADY_EXISTS: "TopicAlreadyExistsError",
    }
    if code in special:
        return special[code]
    name = "".join(part.capitalize() for part in code.name.split("_"))
    return name if name.endswith(("Error", "Exception")) else name + "Error"


_BY_CODE: dict[int, type[ExactlyError]] = {}
for _code in ErrorCode:
    if _code == ErrorCode.NONE:
        continue
    _cls = type(_class_name(_code), (ExactlyError,), {
        "code": _code,
        "retriable": _code in RETRIABLE,
        "__doc__": f"Error code {int(_code)} ({_code.name}).",
        "__module__": __name__,
    })
    globals()[_cls.__name__] = _cls
    _BY_CODE[int(_code)] = _cls
del _code, _cls

# Both names of the fencing error lead to the same catch for users.
InvalidProducerEpochError = _BY_CODE[ErrorCode.INVALID_PRODUCER_EPOCH]
ProducerFencedError = _BY_CODE[ErrorCode.PRODUCER_FENCED]


class TransactionAbortedError(ExactlyError):
    """The record's transaction was aborted before the record was sent (the
    producer's abort_transaction, or an earlier error of the transaction)."""
    code = ErrorCode.INVALID_TXN_STATE
    retriable = False


def for_code(code: int, message: str | None = None) -> ExactlyError:
    """Return the exception instance for a non-zero error code (unknown codes map
    to UnknownServerError). Raises ValueError for NONE (0)."""
    if code == ErrorCode.NONE:
        raise ValueError("error code 0 (NONE) is not an error")
    cls = _BY_CODE.get(int(code), _BY_CODE[int(ErrorCode.UNKNOWN_SERVER_ERROR)])
    return cls(message)


def check(code: int, message: str | None = None) -> None:
    """Raise the matching exception when `code` is not NONE."""
    if code:
        raise for_code(code, message)


__all__ = ["ErrorCode", "ExactlyError", "KafkaTimeoutError", "IllegalStateError", "TransactionAbortedError",
           "for_code", "check"] + [c.__name__ for c in _BY_CODE.values()]
