"""The research-lab Jupyter server extension and the home of its JupyterLab extension.

* The server part (:mod:`research_lab_ext.handlers`) adds, under the server's ``base_url`` and behind
  its token/XSRF auth, ``research-lab/dashboards`` (the dashboard templates the launcher shows),
  ``research-lab/dashboards/<id>`` (POST: a fresh copy of one in the user's folder) and
  ``research-lab/live`` (what :func:`lab.overview.snapshot` reads: testbed sites, training runs,
  continuation services) for the side panel.
* The front-end part is a prebuilt JupyterLab 4 extension built from the TypeScript sources in
  ``widgets/labextension/`` (from the official extension template, kind frontend-and-server) and
  installed by the wheel under ``share/jupyter/labextensions/research-lab``; the server part is
  enabled by ``etc/jupyter/jupyter_server_config.d/research_lab_ext.json``. Check both with
  ``jupyter labextension list`` and ``jupyter server extension list``.
"""

from __future__ import annotations

__all__ = ["_jupyter_labextension_paths", "_jupyter_server_extension_points", "_load_jupyter_server_extension"]

__version__ = "0.1.0"


def _jupyter_labextension_paths():
    # in a checkout (editable install: `jupyter labextension develop --overwrite .` links it); a wheel installs
    # the same files as share/jupyter/labextensions/research-lab
    return [{"src": "../widgets/labextension/prebuilt", "dest": "research-lab"}]


def _jupyter_server_extension_points():
    return [{"module": "research_lab_ext"}]


def _load_jupyter_server_extension(server_app):
    """Register the handlers on ``server_app.web_app`` (called by Jupyter Server at start)."""
    from research_lab_ext.handlers import setup_handlers

    settings = setup_handlers(server_app)
    server_app.log.info(
        "research-lab server extension: dashboards from %s, live things under %s",
        settings.dashboards_path(), ", ".join(str(p) for p in settings.roots()),
    )
