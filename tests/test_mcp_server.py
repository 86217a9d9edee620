"""The MCP server as an agent host drives it: the official ``mcp`` client over stdio, against the
real server process (``python -m lab.hpc.mcp_server``) over two sites run by the embedded local
scheduler (real subprocess jobs; no Slurm needed).

Every hostile input of issue #16 is sent and must come back as a tool error naming the field, with
no host file reached and no huge input echoed; the valid calls must still work.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from lab.hpc import skills
from lab.hpc.errors import SkillArgumentError
from lab.hpc.sites import Partition, Site, write_site

REPO = Path(__file__).resolve().parents[1]
CANARY = "canary file: must never reach the agent"
MB = 1 << 20


def _sites(root: Path) -> Path:
    folder = root / "sites"
    folder.mkdir()
    for name, cpus in (("alpha", 2), ("beta", 1)):
        (root / "data" / name).mkdir(parents=True)
        site = Site(
            name=name,
            scheduler="local",
            accounts=["lab"],
            partitions=[Partition(name="local", max_nodes=1, max_walltime_s=600, cpus_per_node=cpus, default=True)],
            data={"kind": "local", "path": str(root / "data" / name)},
        )
        write_site(site, folder / f"{name}.toml")
    return folder


def _text(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


@pytest.fixture(scope="module")
def session_results(tmp_path_factory):
    """One server session: every call the tests below look at, in order, with its result."""
    root = tmp_path_factory.mktemp("mcp")
    sites_dir = _sites(root)
    inputs = root / "inputs"
    inputs.mkdir()
    (inputs / "sample.txt").write_text("hello input\n")
    (root / "canary-1.out").write_text(CANARY)  # workdir/alpha/../../canary-1.out
    (root / "secret").mkdir()
    (root / "secret" / "key.txt").write_text(CANARY)
    os.symlink(root / "secret", root / "data" / "alpha" / "escape")  # a link inside alpha's data endpoint pointing out
    workdir = root / "jobs"
    log = root / "server.log"

    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m", "lab.hpc.mcp_server", "--sites", str(sites_dir), "--db", str(root / "mcp.db"), "--workdir", str(workdir),
            "--endpoint", f"inputs={inputs}",
        ],
        cwd=str(REPO),
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    calls: dict[str, object] = {}

    async def session():
        with log.open("w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                calls["tools"] = (await s.list_tools()).tools

                async def call(label, tool, args):
                    calls[label] = await s.call_tool(tool, args)
                    return calls[label]

                req = {"command": "echo result of $LAB_SITE", "name": "hello", "walltime_s": 60, "account": "lab"}
                # valid calls
                await call("discover", "discover_resources", {})
                await call("specify", "specify_resources", {"site": "alpha", "request": req})
                await call("choose", "choose_site", {"request": req, "policy": "fixed_site", "home": "beta"})
                await call("move", "move_data", {"source_endpoint": "inputs", "source_path": "sample.txt", "site": "alpha", "destination_path": "in/sample.txt", "wait_s": 30})
                a1 = await call("submit_a1", "submit_task", {"request": req, "site": "alpha"})
                a2 = await call("submit_a2", "submit_task", {
                    "request": {**req, "name": "second"}, "site": "alpha",
                    "continuation": {"handler": "lab.hpc.handlers:collect_output", "args": {"max_bytes": 100}},
                })
                b1 = await call("submit_b1", "submit_task", {"request": req, "site": "beta"})
                for label, sub in (("a1", a1), ("a2", a2), ("b1", b1)):
                    job = sub.structured_content
                    for _ in range(200):  # the local scheduler runs them at once; 20 s at most
                        st = await s.call_tool("get_status", {"site": job["site"], "job_id": job["job_id"]})
                        if st.structured_content["state"] == "completed":
                            break
                        await asyncio.sleep(0.1)
                    calls[f"status_{label}"] = st
                    calls[f"retrieve_{label}"] = await s.call_tool("retrieve_results", {"site": job["site"], "job_id": job["job_id"]})
                calls["concurrent"] = await asyncio.gather(  # ten calls at once, as an agent host may send them
                    *[s.call_tool("get_status", {"site": "alpha", "job_id": a1.structured_content["job_id"]}) for _ in range(5)],
                    *[s.call_tool("retrieve_results", {"site": "beta", "job_id": b1.structured_content["job_id"]}) for _ in range(5)],
                )
                a_ids = {a1.structured_content["job_id"], a2.structured_content["job_id"]}
                b_id = b1.structured_content["job_id"]
                not_on_beta = next(i for i in sorted(a_ids) if i != b_id)
                # hostile calls
                await call("canary", "retrieve_results", {"site": "alpha", "job_id": "1", "name": "../../canary"})
                await call("canary_name_ok_pattern", "retrieve_results", {"site": "alpha", "job_id": a1.structured_content["job_id"], "name": "canary"})
                await call("etc", "move_data", {"source_endpoint": "/etc", "source_path": "passwd", "site": "alpha", "destination_path": "passwd"})
                await call("etc_as_path", "move_data", {"source_endpoint": "alpha", "source_path": "/etc/passwd", "site": "alpha", "destination_path": "passwd"})
                await call("dotdot_dest", "move_data", {"source_endpoint": "inputs", "source_path": "sample.txt", "site": "alpha", "destination_path": "../beta/x"})
                await call("symlink_src", "move_data", {"source_endpoint": "alpha", "source_path": "escape/key.txt", "site": "beta", "destination_path": "key.txt"})
                await call("symlink_dest", "move_data", {"source_endpoint": "inputs", "source_path": "sample.txt", "site": "alpha", "destination_path": "escape/planted.txt"})
                await call("cross_site", "retrieve_results", {"site": "beta", "job_id": not_on_beta})
                await call("cross_site_status", "get_status", {"site": "beta", "job_id": not_on_beta})
                await call("other_name", "retrieve_results", {"site": "alpha", "job_id": a1.structured_content["job_id"], "name": "second"})
                await call("wait_s", "move_data", {"source_endpoint": "inputs", "source_path": "sample.txt", "site": "alpha", "destination_path": "w.txt", "wait_s": -1})
                await call("policy", "choose_site", {"request": req, "policy": "random"})
                await call("fixed_no_home", "choose_site", {"request": req, "policy": "fixed_site"})
                await call("fixed_no_home_submit", "submit_task", {"request": req, "policy": "fixed_site"})
                await call("long_path", "move_data", {"source_endpoint": "inputs", "source_path": "a" * 100_000, "site": "alpha", "destination_path": "x"})
                await call("big_command", "submit_task", {"request": {**req, "command": "echo " + "x" * (5 * MB)}, "site": "alpha"})
                await call("big_site", "specify_resources", {"site": "s" * MB, "request": req})
                await call("big_job_id", "get_status", {"site": "alpha", "job_id": "9" * MB})
                await call("account_newline", "specify_resources", {"site": "alpha", "request": {**req, "account": "lab\n#SBATCH --uid=0"}})
                await call("unknown_site", "submit_task", {"request": req, "site": "gamma"})
                await call("unknown_home", "choose_site", {"request": req, "policy": "fixed_site", "home": "gamma"})
                await call("handler_module", "submit_task", {"request": req, "site": "alpha", "continuation": {"handler": "os:system"}})
                await call("handler_stdout", "submit_task", {"request": req, "site": "alpha", "continuation": {"handler": "lab.hpc.handlers:collect_output", "args": {"stdout": "/etc/passwd"}}})
                await call("extra_argument", "get_status", {"site": "alpha", "job_id": "1", "path": "/etc/passwd"})
                # the server still answers after all of that
                await call("after", "discover_resources", {"sites": ["beta"]})

    asyncio.run(asyncio.wait_for(session(), 180))
    calls["root"] = root
    calls["log_bytes"] = log.stat().st_size
    return calls


def refused(result, field: str) -> str:
    """The error text of a refused call; it must name ``field`` and stay short."""
    text = _text(result)
    assert result.is_error, f"not refused: {text[:300]}"
    assert field in text, f"{field!r} not named in {text[:500]!r}"
    assert len(text) < 2500, f"error text of {len(text)} characters"
    assert CANARY not in text
    return text


def test_valid_calls_work(session_results):
    r = session_results
    assert sorted(t.name for t in r["tools"]) == ["choose_site", "discover_resources", "get_status", "move_data", "retrieve_results", "specify_resources", "submit_task"]
    assert {s["name"]: s["available"] for s in r["discover"].structured_content["sites"]} == {"alpha": True, "beta": True}
    assert "echo result of $LAB_SITE" in r["specify"].structured_content["script"] and r["specify"].structured_content["spec"]["account"] == "lab"
    assert r["choose"].structured_content["chosen"] == "beta"
    moved = r["move"].structured_content
    assert moved["state"] == "succeeded" and moved["checksum_verified"]
    assert (r["root"] / "data" / "alpha" / "in" / "sample.txt").read_text() == "hello input\n"
    for label, site in (("a1", "alpha"), ("a2", "alpha"), ("b1", "beta")):
        assert not r[f"submit_{label}"].is_error, _text(r[f"submit_{label}"])
        res = r[f"retrieve_{label}"].structured_content
        assert res["state"] == "completed" and res["exit_code"] == 0 and res["stdout"].strip() == f"result of {site}"
    assert r["submit_a2"].structured_content["continuation_id"] is not None
    assert [c.is_error for c in r["concurrent"]] == [False] * 10
    assert {c.structured_content["state"] for c in r["concurrent"]} == {"completed"}
    assert {c.structured_content["stdout"].strip() for c in r["concurrent"][5:]} == {"result of beta"}
    assert r["after"].structured_content["sites"][0]["name"] == "beta"


def test_results_of_a_file_outside_the_workdir_are_refused(session_results):
    refused(session_results["canary"], "name")
    refused(session_results["canary_name_ok_pattern"], "name")  # a job's own name only
    refused(session_results["other_name"], "name")


def test_host_paths_are_not_endpoints(session_results):
    r = session_results
    refused(r["etc"], "source_endpoint")
    refused(r["etc_as_path"], "source_path")
    refused(r["dotdot_dest"], "destination_path")
    assert not (r["root"] / "data" / "alpha" / "passwd").exists() and not (r["root"] / "data" / "beta" / "x").exists()


def test_symbolic_links_do_not_escape_an_endpoint(session_results):
    r = session_results
    refused(r["symlink_src"], "source_path")
    refused(r["symlink_dest"], "destination_path")
    assert not (r["root"] / "data" / "beta" / "key.txt").exists()
    assert not (r["root"] / "secret" / "planted.txt").exists()


def test_another_sites_job_is_refused(session_results):
    refused(session_results["cross_site"], "job_id")
    refused(session_results["cross_site_status"], "job_id")


@pytest.mark.parametrize(
    "label, field",
    [
        ("wait_s", "wait_s"),
        ("policy", "policy"),
        ("fixed_no_home", "home"),
        ("fixed_no_home_submit", "home"),
        ("long_path", "source_path"),
        ("big_command", "command"),
        ("big_site", "site"),
        ("big_job_id", "job_id"),
        ("account_newline", "account"),
        ("unknown_site", "site"),
        ("unknown_home", "home"),
        ("handler_module", "continuation.handler"),
        ("handler_stdout", "stdout"),
        ("extra_argument", "path"),
    ],
)
def test_bad_arguments_are_refused_naming_the_field(session_results, label, field):
    refused(session_results[label], field)


def test_nothing_huge_is_echoed_or_logged(session_results):
    r = session_results
    assert "x" * 1000 not in _text(r["big_command"]) and "s" * 1000 not in _text(r["big_site"])
    assert r["log_bytes"] < 200_000  # the server's log holds field names, not the 1 MB and 5 MB inputs


def test_tool_schemas_are_the_skills_models(session_results):
    models = {
        "discover_resources": skills.DiscoverResourcesInput,
        "specify_resources": skills.SpecifyResourcesInput,
        "choose_site": skills.ChooseSiteInput,
        "move_data": skills.MoveDataInput,
        "submit_task": skills.SubmitTaskInput,
        "get_status": skills.GetStatusInput,
        "retrieve_results": skills.RetrieveResultsInput,
    }
    tools = {t.name: t.input_schema for t in session_results["tools"]}
    for name, model in models.items():
        assert tools[name] == json.loads(json.dumps(model.model_json_schema())), name
    choose = tools["choose_site"]["properties"]
    assert choose["policy"]["enum"] == ["fixed_site", "least_pending", "earliest_completion"]
    assert choose["input_bytes"]["minimum"] == 0 and tools["move_data"]["properties"]["wait_s"]["minimum"] == 0
    assert "continuation" in tools["submit_task"]["properties"]
    undocumented = []

    def walk(schema, where):
        for key, prop in schema.get("properties", {}).items():
            if "description" not in prop:
                undocumented.append(f"{where}.{key}")
        for name, sub in schema.get("$defs", {}).items():
            walk(sub, f"{where}.$defs.{name}")

    for name, schema in tools.items():
        walk(schema, name)
    assert undocumented == []
    strings = []

    def bounded(schema, where):  # every string argument has a maximum length (or is an enum)
        if schema.get("type") == "string" and "maxLength" not in schema and "enum" not in schema and "const" not in schema:
            strings.append(where)
        for key, sub in schema.get("properties", {}).items():
            bounded(sub, f"{where}.{key}")
        for i, sub in enumerate(schema.get("anyOf", [])):
            bounded(sub, where)
        if isinstance(schema.get("items"), dict):
            bounded(schema["items"], f"{where}[]")
        if isinstance(schema.get("additionalProperties"), dict):
            bounded(schema["additionalProperties"], f"{where}{{}}")
        if isinstance(schema.get("propertyNames"), dict):
            bounded(schema["propertyNames"], f"{where}<key>")
        for name, sub in schema.get("$defs", {}).items():
            bounded(sub, f"$defs.{name}")

    for name, schema in tools.items():
        bounded(schema, name)
    assert strings == []


# --------------------------------------------------------------------------- the skills in-process


@pytest.fixture
def fed(tmp_path):
    folder = _sites(tmp_path)
    federation = skills.Federation.from_folder(folder, db=tmp_path / "lab.db", workdir=tmp_path / "jobs", handler_modules=["lab.hpc.handlers"])
    yield federation
    federation.close()


def test_account_with_a_newline_never_reaches_an_sbatch_line(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("# never started: only the script is rendered\n")
    site = Site(name="gamma", scheduler="slurm", slurm_conf=conf, accounts=["lab"], partitions=[Partition(name="debug", max_nodes=1, max_walltime_s=600, cpus_per_node=2)])
    fed = skills.Federation({"gamma": site}, db=tmp_path / "lab.db", workdir=tmp_path / "jobs")
    try:
        ok = skills.specify_resources(fed, skills.SpecifyResourcesInput(site="gamma", request=skills.ResourceRequest(command="true", account="lab")))
        assert "#SBATCH --account=lab\n" in ok.script
        with pytest.raises(ValueError, match="account"):
            skills.ResourceRequest(command="true", account="lab\n#SBATCH --uid=0")
        with pytest.raises(ValueError, match="partition"):
            skills.ResourceRequest(command="true", partition="debug --uid=0")
    finally:
        fed.close()


def test_endpoint_checks_in_process(fed, tmp_path):
    with pytest.raises(SkillArgumentError) as exc:
        fed.endpoint(str(tmp_path))
    assert exc.value.field == "source_endpoint" and "host path" in str(exc.value)
    alpha = fed.endpoint("alpha")
    (tmp_path / "data" / "alpha" / "d").mkdir()
    assert alpha.resolve("move_data", "source_path", "d/x.bin") == "d/x.bin"
    os.symlink(tmp_path, tmp_path / "data" / "alpha" / "up")
    with pytest.raises(SkillArgumentError, match="outside endpoint 'alpha'") as exc:
        alpha.resolve("move_data", "destination_path", "up/x.bin")
    assert exc.value.field == "destination_path"
    with pytest.raises(SkillArgumentError, match="endpoint name"):
        skills.Federation(fed.sites, db=tmp_path / "other.db", workdir=tmp_path / "jobs", endpoints={"alpha": tmp_path})


def test_job_not_submitted_by_the_federation_is_refused(fed):
    with pytest.raises(SkillArgumentError) as exc:
        skills.retrieve_results(fed, skills.RetrieveResultsInput(site="alpha", job_id="1"))
    assert exc.value.field == "job_id" and "not submitted to site 'alpha'" in str(exc.value)
    with pytest.raises(SkillArgumentError) as exc:
        skills.get_status(fed, skills.GetStatusInput(site="beta", job_id="1"))
    assert exc.value.field == "job_id"


def test_models_refuse_paths_that_climb_or_are_absolute():
    base = {"source_endpoint": "inputs", "site": "alpha", "destination_path": "x"}
    for bad in ("../x", "a/../../x", "/etc/passwd", "~/x", "a\nb", "a\\..\\b"):
        with pytest.raises(ValueError, match="source_path"):
            skills.MoveDataInput(**base, source_path=bad)
    assert skills.MoveDataInput(**base, source_path="a/b..c/d.txt").source_path == "a/b..c/d.txt"


def test_a_globus_sites_paths_stay_under_its_collection_path(tmp_path):
    site = Site(
        name="remote", scheduler="local", partitions=[Partition(name="local", max_nodes=1, max_walltime_s=600, cpus_per_node=1)],
        data={"kind": "globus", "collection_id": "0f1e2d3c-aaaa-bbbb-cccc-000000000000", "path": "/projects/lab"},
    )
    fed = skills.Federation({"remote": site}, db=tmp_path / "lab.db", workdir=tmp_path / "jobs")
    try:
        ep = fed.endpoint("remote", field="site")
        assert (ep.kind, ep.endpoint) == ("globus", "0f1e2d3c-aaaa-bbbb-cccc-000000000000")
        assert ep.resolve("move_data", "destination_path", "in/./x.bin") == "/projects/lab/in/x.bin"
        with pytest.raises(SkillArgumentError) as exc:
            ep.resolve("move_data", "destination_path", "in/../../etc/x")
        assert exc.value.field == "destination_path"
    finally:
        fed.close()
