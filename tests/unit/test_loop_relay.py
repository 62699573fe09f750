"""The relay from the engine thread to the event loop keeps order and wakes the loop once per burst."""

from __future__ import annotations

import asyncio
import threading

from proctor.api.loop_relay import LoopRelay


def test_events_from_another_thread_arrive_in_order_with_one_wake_up_per_burst() -> None:
    async def scenario() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        wake_ups = 0
        original = loop.call_soon_threadsafe

        def counting(callback, *args):  # type: ignore[no-untyped-def]
            nonlocal wake_ups
            wake_ups += 1
            return original(callback, *args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        relay = LoopRelay(loop)
        received: list[int] = []
        done = asyncio.Event()

        def deliver(item: int) -> None:
            received.append(item)
            if item == 99:
                done.set()

        def engine_thread() -> None:
            for item in range(100):  # one burst: the loop is blocked below, so none is drained yet
                relay.send(deliver, item)

        thread = threading.Thread(target=engine_thread)
        thread.start()
        thread.join()  # the loop does not run while we wait here
        await asyncio.wait_for(done.wait(), 5)
        return received, wake_ups

    received, wake_ups = asyncio.run(scenario())
    assert received == list(range(100))
    assert wake_ups == 1
