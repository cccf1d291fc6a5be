"""stop_tasks ends a loop whose cancellation `asyncio.wait_for` swallowed, and is bounded."""

from __future__ import annotations

import asyncio

from gpumedic_bus.tasks import stop_tasks


async def test_a_loop_whose_cancel_wait_for_swallowed_is_stopped():
    loop = asyncio.get_running_loop()
    acks: list[asyncio.Future] = []
    rounds = 0

    async def publishing() -> None:  # as a sampler's loop: wait for each publish's ack
        nonlocal rounds
        while True:
            acks.append(loop.create_future())
            await asyncio.wait_for(acks[-1], 5)
            rounds += 1

    task = asyncio.create_task(publishing())
    await asyncio.sleep(0)
    acks[-1].set_result(None)  # the ack arrives in the same tick as the cancel (gh-86296 on 3.11)
    assert await stop_tasks([task], within_s=5) == set()
    assert task.cancelled()


async def test_a_task_that_never_ends_is_returned_at_the_bound():
    stubborn = True

    async def swallowing() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if not stubborn:
                    raise

    task = asyncio.create_task(swallowing())
    await asyncio.sleep(0)
    assert await stop_tasks([task], within_s=0.3) == {task}
    assert not task.done()
    stubborn = False
    assert await stop_tasks([task]) == set()


async def test_failures_are_retrieved_not_raised():
    async def failing() -> None:
        raise RuntimeError("the loop broke")

    done = asyncio.create_task(failing())
    await asyncio.sleep(0)
    running = asyncio.create_task(asyncio.sleep(10))
    assert await stop_tasks([done, running]) == set()
    assert running.cancelled() and isinstance(done.exception(), RuntimeError)
