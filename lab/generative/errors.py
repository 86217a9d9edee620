"""Errors of the generative facet (``lab.generative``), under :class:`lab.LabError`.

Every error names the object that raised it (operator, prior or method) and, for a
shape error, the shape it expected and the shape it got.
"""

from __future__ import annotations

from lab import LabError

__all__ = [
    "GenerativeError", "OperatorError", "PriorError", "MethodError", "NFEBudgetError", "ResultsError", "ResultsNotFoundError",
]


class GenerativeError(LabError):
    """Base class of every error ``lab.generative`` raises on purpose."""


class OperatorError(GenerativeError, ValueError):
    """A degradation operator was built with bad parameters or applied to a tensor of the wrong shape."""


class PriorError(GenerativeError, ValueError):
    """A prior was fitted to bad data, queried with a bad shape or time, or asked for what it cannot give."""


class MethodError(GenerativeError, ValueError):
    """An unknown restoration method, a bad hyper-parameter, or inputs that do not fit together."""


class NFEBudgetError(MethodError):
    """A method cannot spend exactly the requested number of network evaluations (or did not)."""


class ResultsError(GenerativeError):
    """A committed benchmark result that ships with the package (:mod:`lab.generative.results`) cannot be read."""

    def __init__(self, message: str, *, name: str, path):
        super().__init__(message)
        self.name, self.path = name, path


class ResultsNotFoundError(ResultsError, FileNotFoundError):
    """The shipped copy of a benchmark result is missing (``path`` is the file that was looked for)."""
