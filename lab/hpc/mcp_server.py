"""The HPC skills as an MCP server, so any MCP-speaking agent can drive the lab's sites.

    python -m lab.hpc.mcp_server --sites DIR --db FILE --workdir DIR     # stdio transport

Tools (one per skill of :mod:`lab.hpc.skills`, with the same pydantic input and
output schemas): ``discover_resources``, ``specify_resources``, ``choose_site``,
``move_data``, ``submit_task``, ``get_status``, ``retrieve_results``. A refused request
(:class:`~lab.hpc.errors.PolicyViolation`) or any other :class:`lab.LabError`
comes back as a tool error whose text is the error's message. Built on the
``mcp`` Python SDK's ``MCPServer``.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from lab import LabError
from lab.hpc import skills
from lab.hpc.placement import PlacementDecision
from lab.hpc.schedulers.base import JobStatus
from lab.hpc.transfer import TransferStatus

__all__ = ["build_server", "main"]


def _anticipated(fn):
    """Turn the lab's deliberate errors (a refused request, an unavailable site) into MCP tool
    errors whose text the agent reads; anything else stays a crash."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except LabError as exc:
            raise ToolError(str(exc)) from exc

    return wrapper


def build_server(fed: skills.Federation) -> MCPServer:
    """An MCP server exposing the skills over ``fed``."""
    server = MCPServer("research-lab-hpc", instructions="Drive a federation of HPC sites: discover, specify, move data, submit, watch, retrieve.")

    @server.tool(description="List every site's partitions, limits and live queue (pending, running, idle CPUs).")
    @_anticipated
    def discover_resources(sites: list[str] | None = None) -> skills.DiscoverResourcesOutput:
        return skills.discover_resources(fed, skills.DiscoverResourcesInput(sites=sites))

    @server.tool(description="Check a request against a site's policy and render its batch script; submits nothing.")
    @_anticipated
    def specify_resources(site: str, request: skills.ResourceRequest) -> skills.SpecifyResourcesOutput:
        return skills.specify_resources(fed, skills.SpecifyResourcesInput(site=site, request=request))

    @server.tool(description="Where a placement policy would run a request now, with what every site showed.")
    @_anticipated
    def choose_site(request: skills.ResourceRequest, policy: str = "earliest_completion", home: str | None = None, input_bytes: int = 0) -> PlacementDecision:
        return skills.choose_site(fed, skills.ChooseSiteInput(request=request, policy=policy, home=home, input_bytes=input_bytes))

    @server.tool(description="Copy a file to a site's data endpoint, verified by sha256.")
    @_anticipated
    def move_data(source_endpoint: str, source_path: str, site: str, destination_path: str, wait_s: float = 600.0) -> TransferStatus:
        return skills.move_data(
            fed, skills.MoveDataInput(source_endpoint=source_endpoint, source_path=source_path, site=site, destination_path=destination_path, wait_s=wait_s)
        )

    @server.tool(description="Submit a job to a site, or let the placement policy choose one (earliest_completion, least_pending, fixed_site).")
    @_anticipated
    def submit_task(
        request: skills.ResourceRequest,
        site: str | None = None,
        policy: str = "earliest_completion",
        home: str | None = None,
        input_bytes: int = 0,
        idempotency_key: str | None = None,
    ) -> skills.SubmitTaskOutput:
        return skills.submit_task(
            fed,
            skills.SubmitTaskInput(request=request, site=site, policy=policy, home=home, input_bytes=input_bytes, idempotency_key=idempotency_key),
        )

    @server.tool(description="A job's state (pending, running, completed, failed, cancelled, timeout).")
    @_anticipated
    def get_status(site: str, job_id: str) -> JobStatus:
        return skills.get_status(fed, skills.GetStatusInput(site=site, job_id=job_id))

    @server.tool(description="A job's state, exit code and the end of its output file.")
    @_anticipated
    def retrieve_results(site: str, job_id: str, name: str = "lab-job", max_bytes: int = 65536) -> skills.RetrieveResultsOutput:
        return skills.retrieve_results(fed, skills.RetrieveResultsInput(site=site, job_id=job_id, name=name, max_bytes=max_bytes))

    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.hpc.mcp_server", description=__doc__.splitlines()[0])
    parser.add_argument("--sites", required=True, type=Path, help="folder of site *.toml files")
    parser.add_argument("--db", required=True, type=Path, help="database shared with the continuation service")
    parser.add_argument("--workdir", required=True, type=Path, help="where job output goes")
    args = parser.parse_args(argv)
    fed = skills.Federation.from_folder(args.sites, db=args.db, workdir=args.workdir)
    try:
        build_server(fed).run("stdio")
    finally:
        fed.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
