"""The simulated fleet's held reads on callbacks (``_hold``), against what
the coroutine they replace did: answer when woken or when the wait ends,
withdraw the wait when the client goes away, and pass on an answer that
comes later or never."""

from __future__ import annotations

import asyncio

from reconciler.node.http_server import Response
from reconciler.simulation.fleet import _hold, _wake


def run(test: object) -> None:
    assert asyncio.iscoroutine(test)
    asyncio.run(test)


def test_a_held_read_answers_when_woken_with_the_answer_of_that_moment() -> None:
    async def main() -> None:
        waiters: list[asyncio.Future[None]] = []
        state = {"value": "running"}
        held = _hold(waiters, 30, lambda: Response(200, state["value"].encode()))
        await asyncio.sleep(0.01)
        assert not held.done() and len(waiters) == 1
        state["value"] = "succeeded"
        _wake(waiters)
        answer = await asyncio.wait_for(held, 1)
        assert answer.body == b"succeeded"
        assert waiters == []

    run(main())


def test_a_held_read_answers_when_its_wait_ends() -> None:
    async def main() -> None:
        waiters: list[asyncio.Future[None]] = []
        loop = asyncio.get_running_loop()
        started = loop.time()
        answer = await asyncio.wait_for(_hold(waiters, 0.1, lambda: Response(200, b"x")), 2)
        assert answer.body == b"x"
        assert loop.time() - started >= 0.09
        assert waiters == []

    run(main())


def test_a_withdrawn_held_read_leaves_no_waiter_and_computes_nothing() -> None:
    async def main() -> None:
        waiters: list[asyncio.Future[None]] = []
        asked: list[int] = []

        def answer() -> Response:
            asked.append(1)
            return Response(200)

        held = _hold(waiters, 30, answer)
        held.cancel()  # the server does this when the client goes away
        await asyncio.sleep(0.01)
        assert waiters == [] and asked == []
        _wake(waiters)
        await asyncio.sleep(0.01)
        assert asked == []

    run(main())


def test_an_answer_that_comes_later_is_passed_on_and_one_that_never_comes_never_is() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        later: asyncio.Future[Response] = loop.create_future()
        never: asyncio.Future[Response] = loop.create_future()
        first = _hold([], 0.01, lambda: later)
        second = _hold([], 0.01, lambda: never)
        await asyncio.sleep(0.05)
        assert not first.done() and not second.done()
        later.set_result(Response(503, b"down"))
        assert (await asyncio.wait_for(first, 1)).status == 503
        await asyncio.sleep(0.05)
        assert not second.done()
        second.cancel()

    run(main())
