"""`with` for the objects whose leaving is their `close()`: the one `__enter__`/`__exit__` pair
the RecordIO writer, the etcd master locator and the like share."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Closing:
    """A context manager that returns itself and closes on leaving, whatever the exit."""

    def close(self) -> None:
        """Release what the object holds; idempotent in every subclass."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
