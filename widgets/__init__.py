"""Jupyter views over ``lab`` objects: thin ipywidgets / anywidget front ends.

Widgets take ``lab`` objects in and call ``lab`` methods out; they compute
nothing themselves.

* :class:`QueueDashboard` -- several HPC sites' queues replayed side by side from traces;
  ``QueueDashboard.live(db, sites)`` gives the live view of a running federation.
* :class:`LiveSitesDashboard` -- that live view: queues, placement decisions and events from the event log.
* :class:`ProvenanceExplorer` -- an agent run's execution graph: trust, eligibility for an agent, gate
  decisions; click a node for its lineage and details.
* :class:`TrainingMonitor` -- training runs followed live from their event log: loss, step time split into
  compute and communication, bytes sent, codec error, overlaid per run, and every rank's status.
* :class:`RestorationDemo` -- flow-matching image restoration of one image (a test image or the user's upload):
  degradation, method (ReBridge-Flow and its readings, the re-coupled ADMM variant, the baselines), NFE and
  hyper-parameters in; degraded, restored, ground truth and Bayes ceiling with PSNR/SSIM out, and a scrubbable
  trajectory of a_hat, b_hat, b_bar, the defect terms and the measurement mismatch per step; an example gallery,
  a side-by-side compare of two methods and PNG downloads.
* :class:`PerfModelExplorer` -- what-if view of one distributed GPT training step: configuration and hardware in;
  the predicted step by operator and collective per pipeline stage, the pipeline schedule as a Gantt chart and the
  measured step beside it where the benchmark ran that configuration.
* :class:`VideoDemo` -- ConFiner video generation (control, spatial and temporal experts, coordinated through x0):
  the generated clip beside each expert alone and a real held-out clip, a frame scrubber and a metrics table.

Building blocks the views share: :class:`~widgets.live_chart.LiveChart` (a plotly figure drawn whole from one
synced dict), :class:`~widgets.sortable_table.SortableTable`, :class:`~widgets.download.DownloadButton`,
:class:`~widgets.image_gallery.ImageGallery`.
"""

from widgets.live_dashboard import LiveSitesDashboard
from widgets.perfmodel_explorer import PerfModelExplorer
from widgets.provenance_explorer import ProvenanceExplorer
from widgets.queue_dashboard import QueueDashboard
from widgets.restoration_demo import RestorationDemo
from widgets.training_monitor import TrainingMonitor
from widgets.video_demo import VideoDemo

__all__ = ["LiveSitesDashboard", "PerfModelExplorer", "ProvenanceExplorer", "QueueDashboard", "RestorationDemo", "TrainingMonitor", "VideoDemo"]
