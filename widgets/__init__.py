"""Jupyter views over ``lab`` objects: thin ipywidgets / anywidget front ends.

Widgets take ``lab`` objects in and call ``lab`` methods out; they compute
nothing themselves.

* :class:`QueueDashboard` -- several HPC sites' queues replayed side by side.
"""

from widgets.queue_dashboard import QueueDashboard

__all__ = ["QueueDashboard"]
