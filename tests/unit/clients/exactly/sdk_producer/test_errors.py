"""The SDK's exception classes: one written-out class per Kafka error code, each
classified as KIP-1050 does (retriable, abortable, fatal)."""
import ast
import pathlib

import pytest

import exactly
from exactly import errors
from exactly_wire.error_codes import FATAL, RETRIABLE, ErrorCode

ERRORS_PY = pathlib.Path(errors.__file__)


def _defined_classes() -> dict[str, str]:
    """Class name -> the ErrorCode member it sets, read from the source text."""
    tree = ast.parse(ERRORS_PY.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and getattr(stmt.targets[0], "id", "") == "code":
                    out[node.name] = stmt.value.attr
    return out


def test_every_code_has_a_class_written_out_in_the_source():
    defined = _defined_classes()
    codes = {c.name for c in ErrorCode if c is not ErrorCode.NONE}
    assert set(defined.values()) == codes
    assert "type(" not in ERRORS_PY.read_text()  # no generated classes


@pytest.mark.parametrize("code", [c for c in ErrorCode if c is not ErrorCode.NONE], ids=lambda c: c.name)
def test_classification_is_exclusive_and_follows_the_code_sets(code):
    exc = errors.for_code(code, "m")
    assert exc.code == code and exc.message == "m"
    assert exc.retriable == (code in RETRIABLE)
    assert exc.fatal == (code in FATAL)
    assert [exc.retriable, exc.fatal, exc.txn_requires_abort].count(True) == 1
    assert getattr(errors, type(exc).__name__) is type(exc)
    assert type(exc).__name__ in errors.__all__


def test_kip_1050_examples():
    assert errors.ProducerFencedError.fatal and not errors.ProducerFencedError.txn_requires_abort
    assert errors.InvalidProducerEpochError.fatal
    assert errors.TransactionalIdAuthorizationFailedError.fatal
    assert errors.OutOfOrderSequenceNumberError.txn_requires_abort  # KIP-360: abort, epoch bump
    assert errors.MessageTooLargeError.txn_requires_abort
    assert errors.NotLeaderOrFollowerError.retriable
    assert errors.KafkaTimeoutError.retriable and isinstance(errors.KafkaTimeoutError(), errors.RequestTimedOutError)
    assert errors.TransactionAbortedError.txn_requires_abort and not errors.TransactionAbortedError.fatal
    usage = errors.IllegalStateError("x")
    assert not (usage.retriable or usage.fatal or usage.txn_requires_abort)


def test_unknown_code_maps_to_unknown_server_error_and_none_is_refused():
    assert type(errors.for_code(9999)) is errors.UnknownServerError
    with pytest.raises(ValueError):
        errors.for_code(0)
    errors.check(0)
    with pytest.raises(errors.NotCoordinatorError):
        errors.check(ErrorCode.NOT_COORDINATOR)


def test_configuration_error_names_key_value_and_allowed_and_is_a_value_error():
    e = errors.ConfigurationError("bad", key="acks", value="2", allowed="0, 1, all")
    assert (e.key, e.value, e.allowed, e.code) == ("acks", "2", "0, 1, all", ErrorCode.INVALID_CONFIG)
    assert isinstance(e, ValueError) and e.fatal


def test_packages_are_typed():
    assert (pathlib.Path(exactly.__file__).parent / "py.typed").is_file()
    import exactly_wire
    assert (pathlib.Path(exactly_wire.__file__).parent / "py.typed").is_file()
