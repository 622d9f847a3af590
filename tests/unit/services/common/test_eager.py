"""Coroutines started at once (services/common/eager.py): the first step in the
caller's turn of the loop, as the first step of a task of their own; the rest in that
task; outcomes, cancellation and exceptions as asyncio's tasks and gather have them.
Each test runs on asyncio's loop and on uvloop's (the services' default)."""
import asyncio
import contextvars
import gc

import pytest
import uvloop

from services.common import eager

VAR = contextvars.ContextVar("eager_test_var", default="unset")


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request):
    def runner(main):
        if request.param == "uvloop":
            return uvloop.run(main())
        return asyncio.run(main())
    return runner


def _turn_marker():
    """A list that gets an item once the loop took one more turn."""
    turned: list[int] = []
    asyncio.get_running_loop().call_soon(turned.append, 1)
    return turned


def test_a_coroutine_that_never_waits_ends_within_the_callers_turn(run):
    async def main():
        caller = asyncio.current_task()
        seen = {}

        async def job():
            seen["task"] = asyncio.current_task()
            VAR.set("job")
            return 7
        turned = _turn_marker()
        started = eager.start(job())
        assert started.outcome.done() and started.outcome.result() == 7
        assert turned == []  # no turn of the loop was taken
        assert seen["task"] is started.task and seen["task"] is not caller
        assert asyncio.current_task() is caller  # given back
        assert VAR.get() == "unset"  # the job's context is its own
        assert await started.task == 7
    run(main)


def test_gather_of_jobs_that_never_wait_takes_no_turn_where_asyncio_gather_takes_two(run):
    async def job(i):
        return i * 2

    async def main():
        turned = _turn_marker()
        assert await eager.gather([job(i) for i in range(3)]) == [0, 2, 4]
        assert turned == []
        turned = _turn_marker()
        assert await asyncio.gather(*(job(i) for i in range(3))) == [0, 2, 4]
        assert turned == [1]
    run(main)


def test_a_coroutine_that_waits_goes_on_in_its_task(run):
    async def main():
        gate = asyncio.get_running_loop().create_future()
        steps = []

        async def job():
            steps.append(("first", asyncio.current_task()))
            value = await gate
            await asyncio.sleep(0)  # a bare yield too
            steps.append(("rest", asyncio.current_task()))
            return value + 1
        started = eager.start(job(), name="waiting-job")
        assert not started.outcome.done() and steps == [("first", started.task)]
        assert started.task.get_name() == "waiting-job"
        gate.set_result(41)
        assert await started.outcome == 42
        assert steps[1] == ("rest", started.task)
        assert await started.task == 42
    run(main)


def test_asyncio_timeout_entered_in_the_first_step_cancels_the_job_not_the_caller(run):
    async def main():
        never = asyncio.get_running_loop().create_future()

        async def job():
            try:
                async with asyncio.timeout(0.001):
                    await never
            except TimeoutError:
                return "timed out"
            return "not reached"
        started = eager.start(job())
        assert await started.outcome == "timed out"
        assert not asyncio.current_task().cancelling()
        assert never.cancelled()
    run(main)


def test_cancelling_the_outcome_leaves_the_job_running(run):
    async def main():
        gate = asyncio.get_running_loop().create_future()
        ended = []

        async def job():
            await gate
            ended.append(True)
            return "done"
        started = eager.start(job())
        waiter = asyncio.ensure_future(started.outcome)
        await asyncio.sleep(0)
        waiter.cancel()  # the awaiter gave up (shielded: the job goes on)
        with pytest.raises(asyncio.CancelledError):
            await waiter
        gate.set_result(None)
        assert await started.task == "done" and ended == [True]
    run(main)


@pytest.mark.parametrize("first_turn", [True, False], ids=["after its first turn", "before its first turn"])
def test_cancelling_the_task_cancels_the_job_where_it_waits(run, first_turn):
    async def main():
        gate = asyncio.get_running_loop().create_future()
        cleaned = []

        async def job():
            try:
                await gate
            finally:
                cleaned.append(True)
        started = eager.start(job())
        if first_turn:
            await asyncio.sleep(0)  # the task took its first turn and waits on the gate
        started.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await started.task
        assert cleaned == [True] and started.outcome.cancelled() and gate.cancelled()
    run(main)


def test_exceptions_reach_the_outcome_and_the_task_and_nothing_is_logged_unretrieved(run):
    reported = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx))
        gate = asyncio.get_running_loop().create_future()

        async def at_once():
            raise ValueError("at once")

        async def later():
            await gate
            raise KeyError("later")
        first = eager.start(at_once())
        with pytest.raises(ValueError):
            first.outcome.result()
        second = eager.start(later())
        gate.set_result(None)
        with pytest.raises(KeyError):
            await second.outcome
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert first.task.done() and isinstance(first.task.exception(), ValueError)
        # An abandoned started job whose outcome nobody awaits.
        eager.start(at_once())
        await asyncio.sleep(0)
        gc.collect()
    run(main)
    gc.collect()
    assert reported == []


def test_gather_raises_the_first_exception_in_order_once_every_job_ended(run):
    async def main():
        gate = asyncio.get_running_loop().create_future()
        ended = []

        async def slow_ok():
            await gate
            ended.append("slow")
            return 1

        async def fails(i):
            raise RuntimeError(f"job {i}")
        task = asyncio.ensure_future(eager.gather([slow_ok(), fails(1), fails(2)]))
        await asyncio.sleep(0)
        assert not task.done()  # waits for the slow job, unlike asyncio.gather
        gate.set_result(None)
        with pytest.raises(RuntimeError, match="job 1"):
            await task
        assert ended == ["slow"]
    run(main)


def test_cancelling_gather_cancels_the_jobs_still_running(run):
    async def main():
        loop = asyncio.get_running_loop()
        gates = [loop.create_future(), loop.create_future()]
        both = loop.create_future()
        cancelled = []

        async def waits(gate):
            try:
                await gate
            except asyncio.CancelledError:
                cancelled.append(True)
                if len(cancelled) == 2:
                    both.set_result(None)
                raise

        async def at_once():
            return 1
        task = asyncio.ensure_future(eager.gather([at_once(), waits(gates[0]), waits(gates[1])]))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(both, 1)
        assert cancelled == [True, True] and all(g.cancelled() for g in gates)
    run(main)


def test_a_job_cancelled_on_its_own_makes_gather_raise_cancelled_error(run):
    async def main():
        gate = asyncio.get_running_loop().create_future()

        async def waits():
            await gate
        started_jobs = []
        real_start = eager.start

        def spy(coro, name=None, spawn=None):
            s = real_start(coro, name, spawn)
            started_jobs.append(s)
            return s
        eager.start = spy
        try:
            task = asyncio.ensure_future(eager.gather([waits()]))
            await asyncio.sleep(0)
        finally:
            eager.start = real_start
        started_jobs[0].task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    run(main)


def test_spawn_makes_the_task(run):
    async def main():
        made = []

        def spawn(coro, name, context):
            task = asyncio.get_running_loop().create_task(coro, name=name, context=context)
            made.append(task)
            return task

        async def job():
            return asyncio.current_task()
        started = eager.start(job(), "named", spawn)
        assert made == [started.task] and started.outcome.result() is started.task
    run(main)


def test_a_bare_yield_in_the_first_step_costs_one_turn_as_in_a_task(run):
    async def main():
        order: list[str] = []

        async def job():
            await asyncio.sleep(0)
            order.append("job resumed")
            await asyncio.sleep(0)
            order.append("job resumed again")
        eager.start(job())
        asyncio.get_running_loop().call_soon(order.append, "one turn")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return order
    assert run(main) == ["job resumed", "one turn", "job resumed again"]
