"""services.common.cluster.owned.FirstTryThenRetrying: the retry loop of the coordinators'
steps, whose first attempt runs without tenacity. A step that succeeds at once builds no
tenacity loop; a RetryLater waits the first backoff and retries under tenacity until the
step succeeds; any other exception propagates at once."""
from __future__ import annotations

import asyncio

import pytest
from tenacity import AsyncRetrying, retry_if_exception_type, wait_fixed

from services.common.cluster.owned import FirstTryThenRetrying, RetryLater


def _loop(sleeps: list[float], built: list[int], retried: list[BaseException]) -> FirstTryThenRetrying:
    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    def make() -> AsyncRetrying:
        built.append(1)
        return AsyncRetrying(sleep=sleep, retry=retry_if_exception_type(RetryLater), reraise=True, wait=wait_fixed(2))

    return FirstTryThenRetrying(make, RetryLater, lambda: 1.0, sleep, retried.append)


async def _run(outcomes: list) -> tuple[int, list[float], list[int], list[BaseException]]:
    """Run a step whose attempts end as `outcomes` says (an exception is raised,
    anything else returned); (attempts made, sleeps, loops built, first retried)."""
    sleeps, built, retried, attempts = [], [], [], 0
    async for attempt in _loop(sleeps, built, retried):
        with attempt:
            outcome = outcomes[attempts]
            attempts += 1
            if isinstance(outcome, BaseException):
                raise outcome
    return attempts, sleeps, built, retried


def test_a_step_that_succeeds_at_once_builds_no_retry_loop():
    assert asyncio.run(_run(["ok"])) == (1, [], [], [])


def test_a_step_asking_for_a_retry_waits_the_first_backoff_then_retries_until_it_succeeds():
    first = RetryLater("not yet")
    attempts, sleeps, built, retried = asyncio.run(_run([first, RetryLater("still not"), "ok"]))
    assert attempts == 3 and built == [1] and retried == [first]
    assert sleeps == [1.0, 2]  # the first backoff, then tenacity's


def test_other_exceptions_propagate_from_any_attempt():
    with pytest.raises(KeyError):
        asyncio.run(_run([KeyError("bug")]))
    with pytest.raises(ValueError):
        asyncio.run(_run([RetryLater("not yet"), ValueError("bug")]))
