"""The HPC skills as an MCP server, so any MCP-speaking agent can drive the lab's sites.

    python -m lab.hpc.mcp_server --sites DIR --db FILE --workdir DIR \\
        [--endpoint NAME=DIR ...] [--handler-module MODULE ...]          # stdio transport

Tools (one per skill of :mod:`lab.hpc.skills`): ``discover_resources``,
``specify_resources``, ``choose_site``, ``move_data``, ``submit_task``,
``get_status``, ``retrieve_results``. Each tool is built from its skill's pydantic
input model (:func:`tool_from_model`): its arguments are the model's fields and its
input schema is the model's JSON schema (enums, bounds, patterns, descriptions), and
every call is validated by the model itself before the skill runs.

Every refusal is a tool error (``isError``) whose text names the field: a value the
schema refuses (``wait_s=-1``, ``policy="random"``, a 100,000-character path), a rule
across fields (``fixed_site`` without ``home``), and the skill's own checks
(:class:`~lab.hpc.errors.SkillArgumentError`: a host path as an endpoint, a job the
federation did not submit there; :class:`~lab.hpc.errors.PolicyViolation`; any other
:class:`lab.LabError`). Error texts are cut to :data:`MAX_ERROR_CHARS`, so a huge input is
never echoed back. Built on the ``mcp`` Python SDK's ``MCPServer``.

The server is the boundary between an agent and this host: it exposes only the sites'
data endpoints and the ``--endpoint`` folders the operator names, and continuation
handlers only from the ``--handler-module`` modules (default ``lab.hpc.handlers``).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from pydantic import BaseModel, ConfigDict, ValidationError

from lab import LabError
from lab.hpc import skills
from lab.hpc.errors import clip_text
from lab.hpc.placement import PlacementDecision
from lab.hpc.schedulers.base import JobStatus
from lab.hpc.transfer import TransferStatus

__all__ = ["MAX_ERROR_CHARS", "DEFAULT_HANDLER_MODULES", "build_server", "tool_from_model", "validation_message", "main"]

#: Longest tool-error text sent back (characters).
MAX_ERROR_CHARS = 2000
#: Where continuation handlers may come from unless ``--handler-module`` says otherwise.
DEFAULT_HANDLER_MODULES = ("lab.hpc.handlers",)


def validation_message(exc: ValidationError, limit: int = MAX_ERROR_CHARS) -> str:
    """One line per refused field, ``field: reason``, without the refused values (they can be huge)."""
    lines = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{loc}: {msg}" if loc else msg)
    return clip_text("invalid arguments: " + "; ".join(lines), limit)


def _refusals(fn: Callable) -> Callable:
    """Turn a refused call into an MCP tool error whose text the agent reads (naming the field);
    anything else stays a crash (logged by the server, reported without detail)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ValidationError as exc:
            raise ToolError(validation_message(exc)) from exc
        except LabError as exc:
            raise ToolError(clip_text(str(exc), MAX_ERROR_CHARS)) from exc

    return wrapper


def tool_from_model(model: type[BaseModel], skill: Callable[[BaseModel], Any], *, name: str, description: str, returns: Any) -> Tool:
    """An MCP tool ``name`` whose arguments are ``model``'s fields and whose input schema is
    ``model.model_json_schema()`` (enums, bounds, patterns, descriptions; no other argument).

    The tool function's signature is built from the model (each field's type with its
    ``FieldInfo``), so the SDK validates the arguments field by field with the model's own
    constraints and refuses unknown ones; the body then builds ``model`` itself (running its
    cross-field validators) and calls ``skill(instance)``. Refusals become tool errors naming
    the field (:func:`_refusals`).
    """
    params = []
    for field_name, info in model.model_fields.items():
        default = inspect.Parameter.empty if info.is_required() or info.default_factory is not None else info.default
        params.append(inspect.Parameter(field_name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[info.annotation, info], default=default))

    @_refusals
    def tool(**kwargs):
        return skill(model(**kwargs))

    tool.__name__ = name
    tool.__doc__ = description
    tool.__signature__ = inspect.Signature(params, return_annotation=returns)
    made = Tool.from_function(tool, name=name, description=description)
    base = made.fn_metadata.arg_model
    made.fn_metadata.arg_model = _strict(base)
    made.parameters = model.model_json_schema()
    return made


def _strict(arg_model: type[BaseModel]) -> type[BaseModel]:
    """``arg_model`` refusing arguments it does not define (the SDK's own ignores them)."""
    return type(arg_model.__name__, (arg_model,), {"model_config": ConfigDict(arbitrary_types_allowed=True, extra="forbid"), "__module__": __name__})


def build_server(fed: skills.Federation) -> MCPServer:
    """An MCP server exposing the skills over ``fed`` (give ``fed`` its ``handler_modules``)."""
    tools = [
        (
            "discover_resources",
            skills.DiscoverResourcesInput,
            skills.discover_resources,
            skills.DiscoverResourcesOutput,
            "List every site's partitions, limits and live queue (pending, running, idle CPUs).",
        ),
        (
            "specify_resources",
            skills.SpecifyResourcesInput,
            skills.specify_resources,
            skills.SpecifyResourcesOutput,
            "Check a request against a site's policy and render its batch script; submits nothing.",
        ),
        (
            "choose_site",
            skills.ChooseSiteInput,
            skills.choose_site,
            PlacementDecision,
            "Where a placement policy would run a request now, with what every site showed.",
        ),
        (
            "move_data",
            skills.MoveDataInput,
            skills.move_data,
            TransferStatus,
            "Copy a file from one of the federation's data endpoints (a site, or a configured endpoint) to a site's data endpoint, verified by sha256.",
        ),
        (
            "submit_task",
            skills.SubmitTaskInput,
            skills.submit_task,
            skills.SubmitTaskOutput,
            "Submit a job to a site, or let the placement policy choose one (earliest_completion, least_pending, fixed_site); "
            "optionally register a continuation that runs when the job ends.",
        ),
        (
            "get_status",
            skills.GetStatusInput,
            skills.get_status,
            JobStatus,
            "A job's state (pending, running, completed, failed, cancelled, timeout); only jobs this server submitted.",
        ),
        (
            "retrieve_results",
            skills.RetrieveResultsInput,
            skills.retrieve_results,
            skills.RetrieveResultsOutput,
            "A job's state, exit code and the end of its output file; only jobs this server submitted, on the site it submitted them to.",
        ),
    ]
    return MCPServer(
        "research-lab-hpc",
        instructions="Drive a federation of HPC sites: discover, specify, move data, submit, watch, retrieve.",
        tools=[tool_from_model(model, functools.partial(skill, fed), name=name, description=description, returns=returns) for name, model, skill, returns, description in tools],
    )


def _endpoint(text: str) -> tuple[str, Path]:
    name, sep, folder = text.partition("=")
    if not sep or not name or not folder:
        raise argparse.ArgumentTypeError(f"expected NAME=DIR, got {text!r}")
    return name, Path(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.hpc.mcp_server", description=__doc__.splitlines()[0])
    parser.add_argument("--sites", required=True, type=Path, help="folder of site *.toml files")
    parser.add_argument("--db", required=True, type=Path, help="database shared with the continuation service")
    parser.add_argument("--workdir", required=True, type=Path, help="where job output goes")
    parser.add_argument("--endpoint", action="append", type=_endpoint, default=[], metavar="NAME=DIR", help="a data endpoint besides the sites' (repeatable)")
    parser.add_argument(
        "--handler-module", action="append", default=None, metavar="MODULE",
        help=f"a module whose functions may be continuation handlers (repeatable; default {', '.join(DEFAULT_HANDLER_MODULES)})",
    )
    args = parser.parse_args(argv)
    fed = skills.Federation.from_folder(
        args.sites, db=args.db, workdir=args.workdir, endpoints=dict(args.endpoint), handler_modules=args.handler_module or DEFAULT_HANDLER_MODULES
    )
    try:
        build_server(fed).run("stdio")
    finally:
        fed.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
