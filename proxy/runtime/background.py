"""Tasks a service starts and does not await (an early fetch, a refresh, spare connections).

The event loop holds only weak references to its tasks: `BackgroundTasks` keeps each one referenced until it
ends, and retrieves its failure, logged at debug under the set's event name (whoever needs the result asks again
and sees the error then).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import structlog

log = structlog.get_logger(__name__)
T = TypeVar("T")


class BackgroundTasks:
    """The running tasks of one kind, started by `start`; `event` names a failure's log line."""

    def __init__(self, event: str) -> None:
        self._event = event
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(
        self,
        work: Coroutine[Any, Any, T],
        *,
        context: contextvars.Context | None = None,
        then: Callable[[asyncio.Task[T]], None] | None = None,
    ) -> asyncio.Task[T]:
        """Run `work` in a task of its own (in `context`, e.g. detached from the request); `then(task)` once it
        ended."""
        task = asyncio.get_running_loop().create_task(work, context=context)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        if then is not None:
            task.add_done_callback(then)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug(self._event, error=str(task.exception()))

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        """The tasks still running."""
        return iter(list(self._tasks))

    def __len__(self) -> int:
        return len(self._tasks)
