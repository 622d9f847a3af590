"""services.common.cluster.verification.TxnVerifier's asking loop: the first ask goes out
as is; a retriable answer is asked again (after a backoff) until another answer or the
deadline; a final answer is returned at once."""
from __future__ import annotations

import asyncio
import time

from exactly_wire.error_codes import ErrorCode
from services.common.cluster.verification import RETRY_CODES, TxnVerifier


def _asks(answers: list[int], deadline_s: float = 5.0) -> tuple[int, int]:
    """(final answer, asks made) of a verifier whose coordinator answers `answers` in turn
    (the last one from then on)."""
    verifier = TxnVerifier(cluster=None, client=None, backoff_ms=1, backoff_max_ms=2)
    asked = []

    async def ask(*args) -> int:
        asked.append(args)
        return answers[min(len(asked), len(answers)) - 1]

    code = asyncio.run(verifier._asking(time.monotonic() + deadline_s, RETRY_CODES, ask, "txn", 7))
    assert all(a == ("txn", 7) for a in asked)
    return code, len(asked)


def test_a_final_answer_is_returned_after_one_ask():
    assert _asks([ErrorCode.NONE]) == (ErrorCode.NONE, 1)
    assert _asks([ErrorCode.INVALID_PRODUCER_EPOCH]) == (ErrorCode.INVALID_PRODUCER_EPOCH, 1)


def test_retriable_answers_are_asked_again_until_a_final_one():
    answers = [ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.NOT_COORDINATOR, ErrorCode.NONE]
    assert _asks(answers) == (ErrorCode.NONE, 3)


def test_a_retriable_answer_past_the_deadline_is_the_answer():
    code, asks = _asks([ErrorCode.COORDINATOR_LOAD_IN_PROGRESS], deadline_s=0.05)
    assert code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS and asks >= 1
