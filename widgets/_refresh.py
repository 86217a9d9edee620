"""Background refresh shared by the live widgets: call ``refresh()`` every few seconds from a thread."""

from __future__ import annotations

import threading


class BackgroundRefresh:
    """Mixin for a widget with a ``refresh()`` method: :meth:`start` calls it every ``interval_s``
    seconds from a daemon thread of the kernel until :meth:`stop`."""

    _refresh_thread_name = "lab-widget-refresh"

    def _init_refresh(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, interval_s: float = 1.0) -> None:
        """Refresh every ``interval_s`` seconds from a background thread until :meth:`stop`."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()

        def loop():
            while not self._stop.wait(interval_s):
                self.refresh()

        self._thread = threading.Thread(target=loop, name=self._refresh_thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the background refresh (the view keeps what it shows)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
