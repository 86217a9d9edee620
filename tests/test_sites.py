"""Site descriptions: loading, the exact errors for bad files, and policy checks before submission."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.hpc.errors import PolicyViolation, SiteError
from lab.hpc.schedulers.base import JobSpec
from lab.hpc.sites import Site, load_site, load_sites, write_site

GOOD = """\
name = "alpha"
scheduler = "slurm"
slurm_conf = "alpha/slurm.conf"
accounts = ["lab", "ops"]

[[partitions]]
name = "debug"
max_nodes = 1
max_walltime_s = 3600
cpus_per_node = 2
default = true

[[partitions]]
name = "long"
max_nodes = 4
max_walltime_s = 86400
cpus_per_node = 8

[environment]
modules = ["python/3.11"]
setup = ["source /opt/site/env.sh"]
variables = { OMP_NUM_THREADS = "1" }

[data]
kind = "globus"
collection_id = "6c54cade-bde5-45c1-bdea-f4bd71dba2cc"
path = "/scratch"

[policies]
require_account = true
"""


@pytest.fixture
def site(tmp_path) -> Site:
    path = tmp_path / "alpha.toml"
    path.write_text(GOOD)
    return load_site(path)


def test_load_resolves_conf_beside_the_file(site, tmp_path):
    assert site.name == "alpha" and site.default_partition.name == "debug"
    assert site.slurm_conf == (tmp_path / "alpha" / "slurm.conf").resolve()
    assert site.data.kind == "globus" and site.total_cpus_per_node == 8


def test_round_trip(site, tmp_path):
    again = load_site(write_site(site, tmp_path / "copy.toml"))
    assert again == site


@pytest.mark.parametrize(
    "edit, field, message",
    [
        (lambda s: s.replace("max_nodes = 1\n", "max_nodes = 0\n"), "partitions.0.max_nodes", "Input should be greater than or equal to 1"),
        (lambda s: s.replace('scheduler = "slurm"', 'scheduler = "pbs"'), "scheduler", "no scheduler adapter named 'pbs'; registered: ['local', 'slurm']"),
        (lambda s: s.replace("max_walltime_s = 3600\n", ""), "partitions.0.max_walltime_s", "Field required"),
        (lambda s: s.replace('slurm_conf = "alpha/slurm.conf"\n', ""), "slurm_conf", "a slurm site needs slurm_conf"),
        (lambda s: s.replace("require_account = true", "require_acount = true"), "policies.require_acount", "Extra inputs are not permitted"),
        (lambda s: s.replace('collection_id = "6c54cade-bde5-45c1-bdea-f4bd71dba2cc"\n', ""), "data.collection_id", "a globus data endpoint needs collection_id"),
    ],
)
def test_bad_file_names_file_and_field(tmp_path, edit, field, message):
    path = tmp_path / "bad.toml"
    path.write_text(edit(GOOD))
    with pytest.raises(SiteError) as excinfo:
        load_site(path)
    assert excinfo.value.field == field
    assert str(excinfo.value) == f"{path}, field {field!r}: {message}"


def test_not_toml(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('name = "x"\nscheduler = \n')
    with pytest.raises(SiteError, match=r"broken.toml: not valid TOML: .*line 2"):
        load_site(path)


def test_load_sites_refuses_two_files_with_one_name(tmp_path):
    (tmp_path / "a.toml").write_text(GOOD)
    (tmp_path / "b.toml").write_text(GOOD)
    with pytest.raises(SiteError, match=r"b.toml, field 'name': site name 'alpha' is also used by .*a.toml"):
        load_sites(tmp_path)
    with pytest.raises(SiteError, match="no \\*.toml site files"):
        load_sites(tmp_path / "empty")


@pytest.mark.parametrize(
    "request_, limit, message",
    [
        (dict(nodes=2), "max_nodes", "site 'alpha' refuses max_nodes=2: allowed at most 1 (partition 'debug')"),
        (dict(walltime_s=7200), "max_walltime_s", "site 'alpha' refuses max_walltime_s=7200: allowed at most 3600 (partition 'debug')"),
        (dict(partition="gpu"), "partition", "site 'alpha' refuses partition='gpu': allowed one of ['debug', 'long'] (unknown partition)"),
        (dict(ntasks=3), "cpus_per_node", "site 'alpha' refuses cpus_per_node=3: allowed at most 2 (partition 'debug': ntasks x cpus_per_task / nodes)"),
        (dict(account=None), "account", "site 'alpha' refuses account=None: allowed one of ['lab', 'ops'] (this site requires an account)"),
        (dict(account="other"), "account", "site 'alpha' refuses account='other': allowed one of ['lab', 'ops'] (not an account of this site)"),
    ],
)
def test_policy_violations_say_which_limit(site, request_, limit, message):
    spec = JobSpec(command="hostname", account="lab").model_copy(update=request_)
    with pytest.raises(PolicyViolation) as excinfo:
        site.check(spec)
    assert excinfo.value.limit == limit and str(excinfo.value) == message


def test_check_completes_the_request_with_the_site_environment(site):
    spec = site.check(JobSpec(command="python run.py", account="lab", nodes=4, ntasks=16, walltime_s=7200, partition="long", environment={"X": "1"}))
    assert spec.partition == "long"
    assert spec.command == "source /opt/site/env.sh\npython run.py"
    assert spec.modules == ["python/3.11"]
    assert spec.environment == {"OMP_NUM_THREADS": "1", "X": "1"}
    assert site.check(JobSpec(command="true", account="ops")).partition == "debug"  # the default
