"""lab.hpc.swf: hand-checked values from the real traces, round trips, and exact error messages."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab import LabError
from lab.hpc import HPCError, SWFError, SWFHeader, SWFTrace, load_trace, parse_swf, read_swf, write_swf
from lab.hpc.errors import ArgumentError, SWFWarning
from lab.hpc.queue import QueueReplay
from lab.hpc.swf import FIELDS, SWFComment

INT_FIELDS = [f for f in FIELDS if f != "average_cpu_time"]


@pytest.fixture(scope="module")
def theta_2022() -> SWFTrace:
    return load_trace("theta_2022")


@pytest.fixture(scope="module")
def hpc2n() -> SWFTrace:
    return load_trace("hpc2n")


@pytest.fixture(scope="module")
def wagap() -> SWFTrace:
    return load_trace("wagap_2013", invalid="unknown")


def row(trace: SWFTrace, i: int) -> list:
    """Job ``i``'s 18 SWF values as the file writes them (-1 for unknown)."""
    return [-1 if pd.isna(v := trace.jobs[f].iloc[i]) else v for f in FIELDS]


def assert_typed_without_minus_one(trace: SWFTrace) -> None:
    for f in INT_FIELDS:
        assert trace.jobs[f].dtype == "Int64", f
    assert trace.jobs["average_cpu_time"].dtype == "Float64"
    for f in FIELDS:  # unknown is <NA>, never the -1 sentinel
        assert not (trace.jobs[f] == -1).any(), f


# --------------------------------------------------------------------------- real traces


def test_theta_2022(theta_2022):
    t = theta_2022
    assert len(t) == 23_911
    assert list(t.jobs.columns) == list(FIELDS)
    assert t.extension is None and t.problems == ()
    assert t.name == "theta_2022.swf"
    h = t.header
    assert (h.max_nodes, h.max_procs, h.unix_start_time) == (4360, 4360, 0)
    assert h.lines == ["; UnixStartTime: 0", "; MaxNodes: 4360", "; MaxProcs: 4360"]
    assert (h.notes, h.queues, h.partitions, h.version) == ([], [], [], None)
    assert row(t, 0) == [1, 1641021254, 52645, 10849, 128, -1, -1, 128, 10800, -1, 0, -1, -1, -1, -1, -1, -1, 0]
    assert row(t, -1) == [23911, 1672445845, 5083, 1261, 256, -1, -1, 256, 21600, -1, 0, -1, -1, -1, -1, -1, -1, 0]
    first = t.jobs.iloc[0]
    assert first["average_cpu_time"] is pd.NA and first["user_id"] is pd.NA and first["think_time"] == 0
    assert t.jobs.loc[0, "user_id"] is pd.NA
    # these fields are -1 throughout the file: all unknown, none zero
    for f in ("average_cpu_time", "used_memory", "requested_memory", "user_id", "group_id", "queue_id"):
        assert t.jobs[f].isna().all(), f
    assert t.jobs["job_id"].tolist() == list(range(1, 23_912))
    assert_typed_without_minus_one(t)
    assert repr(t) == "SWFTrace('theta_2022.swf', jobs=23911, max_nodes=4360, max_procs=4360)"
    assert t.submit_epoch()[0] == 1641021254.0 and t.submit_epoch().dtype == np.float64


def test_theta_2023():
    with pytest.warns(SWFWarning) as caught:  # 8 jobs use more nodes than the header's 4,360
        t = load_trace("theta_2023")  # CRLF line endings and a trailing blank in its first header line
    [w] = caught
    assert "line 1703: job 1700 has allocated_processors = 4389, more than the header's MaxProcs: 4360; 8 jobs in all" in str(w.message)
    assert len(w.message.lines) == 8 and w.message.lines[0] == 1703 and w.message.field == "allocated_processors"
    assert len(t) == 8_401
    assert (t.header.max_nodes, t.header.max_procs, t.header.unix_start_time) == (4360, 4360, 0)
    assert t.header.lines[0] == "; UnixStartTime: 0 "
    assert row(t, 0) == [1, 1693547500, 3725, 7329, 144, -1, -1, 144, 10800, -1, 0, 0, -1, -1, -1, -1, -1, 0]
    assert row(t, -1) == [8401, 1704943178, 34, 1089, 1, -1, -1, 1, 1800, -1, 0, 0, -1, -1, -1, -1, -1, 0]
    assert (t.jobs["user_id"] == 0).all()  # 0 here is a real value, kept as 0
    assert_typed_without_minus_one(t)


def test_hpc2n(hpc2n):
    t = hpc2n
    raw = t.path.read_text().splitlines()
    assert raw[-1].strip() == "" and raw[-1] != ""  # the file ends with a whitespace-only line ...
    assert sum(1 for line in raw if not line.startswith(";")) == 3171
    assert len(t) == 3_170  # ... which is skipped
    h = t.header
    assert (h.max_nodes, h.max_procs, h.unix_start_time) == (240, 240, 1027839845)
    assert (h.version, h.computer, h.preemption) == ("2.2", "Linux cluster (Seth)", "No")
    assert h.installation == "HPC2N - High Performance Computing Center North, Sweden"
    assert (h.max_jobs, h.max_records, h.time_zone, h.time_zone_string) == (527371, 527371, 3600, "Europe/Stockholm")
    assert (h.start_time, h.end_time) == ("Sun Jul 28 09:04:05 CEST 2002", "Mon Jan 16 20:31:24 CET 2006")
    assert (h.max_queues, h.max_partitions) == (1, 2)
    assert h.notes == ["uses MAUI scheduler"]
    assert h.queues == ["1 [fque:1]"]
    assert h.partitions == ["1 DEFAULT", "2 ALL"]
    assert h.lines == raw[:23] and len(h.lines) == 23
    assert row(t, 0) == [1, 0, 308434, 31405, 30, 31405.0, -1, 30, 37980, -1, 1, 1, 1, -1, -1, 1, -1, -1]
    last = t.jobs.iloc[-1]
    assert last["job_id"] == 7183
    assert last["average_cpu_time"] == 129.02 and isinstance(last["average_cpu_time"], float)
    assert row(t, -1) == [7183, 4950011, 15715, 129, 50, 129.02, 18432, 50, 1800, -1, 1, 8, 1, -1, -1, 1, -1, -1]
    assert t.jobs["average_cpu_time"].iloc[-2] == 223.29
    assert t.jobs["run_time"].isna().sum() == 25
    assert t.submit_epoch()[-1] == 1027839845 + 4950011
    assert_typed_without_minus_one(t)


def test_nasa_ipsc_1993():
    t = load_trace("nasa_ipsc_1993")
    assert len(t) == 18_239
    assert t.jobs["wait_time"].isna().all()
    h = t.header
    assert (h.max_procs, h.max_nodes, h.unix_start_time, h.time_zone) == (128, 128, 749458803, -28800)
    assert h.notes == [
        "There is no information on wait times - the given submit times are actually start times",
        "group 1 is normal users group 2 is system personnel",
        "there is no data about batch queues",
        "THIS IS A CLEANED VERSION OF THE LOG! The filter used to produce it was user=3 and proc=1 and app=1 (24025 jobs removed)",
    ]
    assert any("There is no information on wait times" in n for n in h.notes)
    assert h.queues == ["0  interactive", "1  batch"]
    assert row(t, 0) == [1, 0, -1, 1451, 128, -1, -1, -1, -1, -1, -1, 1, 1, -1, -1, -1, -1, -1]
    assert row(t, -1) == [42264, 7948936, -1, 86, 128, -1, -1, -1, -1, -1, -1, 12, 2, -1, -1, -1, -1, -1]
    assert_typed_without_minus_one(t)


def test_wagap_default_read_raises_at_the_first_negative_run_time():
    with pytest.raises(SWFError) as excinfo:
        load_trace("wagap_2013")
    exc = excinfo.value
    assert (exc.line, exc.field) == (4186, "run_time")
    assert exc.reason == "negative value -1359980917; SWF allows -1 (unknown) only"
    assert str(exc) == f"{exc.path}, line 4186, field 'run_time': negative value -1359980917; SWF allows -1 (unknown) only"
    assert exc.path.name == "wagap_2013.swf"


def test_wagap_with_invalid_unknown(wagap):
    t = wagap
    assert len(t) == 17_900
    assert t.extension == "alea"
    assert list(t.jobs.columns) == [*FIELDS, "node_ids", "queue_name", "properties"]
    assert [(p.line, p.field) for p in t.problems] == [(4186, "run_time"), (4200, "run_time")]
    assert str(t.problems[0]) == (
        f"{t.path}, line 4186, field 'run_time': negative value -1359980917; SWF allows -1 (unknown) only; kept as unknown"
    )
    assert t.problems[1].reason == "negative value -1359981026; SWF allows -1 (unknown) only; kept as unknown"
    bad = t.jobs[t.jobs["job_id"].isin([4185, 4199])]
    assert bad.index.tolist() == [4185, 4199]  # lines 4186 and 4200 (no header; job ids count from 0)
    assert bad["run_time"].isna().all()
    assert bad["submit_time"].tolist() == [1359980916, 1359981026]  # the rest of the job is kept
    assert t.jobs["run_time"].isna().sum() == 2
    job0 = t.jobs.iloc[0]
    assert job0["job_id"] == 0
    assert isinstance(job0["node_ids"], tuple) and len(job0["node_ids"]) == 64
    assert set(job0["node_ids"]) == {1241}
    assert job0["queue_name"] == "q_1d"
    assert job0["properties"] == "1:ppn=64:x86_64:cl_zewura#excl"
    assert t.jobs["queue_name"].dtype == "string" and t.jobs["properties"].dtype == "string"
    assert t.jobs.loc[4185, "node_ids"] == (1284,)
    assert t.jobs["requested_memory"].iloc[0] == 68719476736  # bytes as written, above 2**32
    assert t.header == SWFHeader()  # no header lines at all
    assert repr(t) == "SWFTrace('wagap_2013.swf', jobs=17900, max_nodes=None, max_procs=None, extension='alea', problems=2)"
    assert_typed_without_minus_one(t)


# --------------------------------------------------------------------------- round trips


def assert_same_trace(a: SWFTrace, b: SWFTrace) -> None:
    pd.testing.assert_frame_equal(a.jobs, b.jobs)
    assert a.header == b.header
    assert a.extension == b.extension


@pytest.mark.parametrize("suffix", [".swf", ".swf.gz"])
def test_round_trip_hpc2n(hpc2n, tmp_path, suffix):
    out = write_swf(hpc2n, tmp_path / f"hpc2n{suffix}")
    assert out == tmp_path / f"hpc2n{suffix}"
    if suffix.endswith(".gz"):
        assert out.read_bytes()[:2] == b"\x1f\x8b"  # really gzip
        assert gzip.decompress(out.read_bytes()).decode().startswith("; Version: 2.2\n")
    back = read_swf(out)
    assert_same_trace(hpc2n, back)
    assert back.jobs["average_cpu_time"].iloc[-1] == 129.02
    assert back.name == "hpc2n.swf"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"hpc2n{suffix}"]  # no temporary left behind


@pytest.mark.parametrize("suffix", [".swf", ".swf.gz"])
def test_round_trip_theta_2022(theta_2022, tmp_path, suffix):
    out = write_swf(theta_2022, tmp_path / f"theta{suffix}")
    assert_same_trace(theta_2022, read_swf(out))
    if suffix == ".swf":  # single-space, LF file: even the bytes come back
        assert out.read_bytes() == theta_2022.path.read_bytes()


@pytest.mark.parametrize("suffix", [".swf", ".swf.gz"])
def test_round_trip_wagap_extension_and_problem_values(wagap, tmp_path, suffix):
    out = write_swf(wagap, tmp_path / f"wagap{suffix}")
    lines = (gzip.open(out, "rt") if suffix.endswith(".gz") else out.open()).read().splitlines()
    assert lines[4185].split()[3] == "-1"  # the problem value is written as unknown ...
    assert lines[0].split()[18] == "{" + ",".join(["1241"] * 64) + "}"
    back = read_swf(out)  # ... so the default (strict) read now succeeds
    assert back.problems == ()
    assert_same_trace(wagap, back)
    assert back.header == SWFHeader() and back.header.lines == []


def test_write_replaces_an_existing_file(hpc2n, tmp_path):
    out = tmp_path / "x.swf"
    out.write_text("junk\n")
    write_swf(hpc2n, out)
    assert_same_trace(hpc2n, read_swf(out))


def test_header_without_verbatim_lines_is_synthesized(tmp_path):
    jobs = parse_swf("1 0 5 10 2 -1 -1 2 20 -1 1 -1 -1 -1 -1 -1 -1 -1\n").jobs
    header = SWFHeader(max_procs=64, unix_start_time=5000, computer="toy", queues=["1 batch"], notes=["made up"])
    out = write_swf(SWFTrace(jobs=jobs, header=header), tmp_path / "toy.swf")
    assert out.read_text().splitlines()[:5] == [
        "; Computer: toy",
        "; UnixStartTime: 5000",
        "; MaxProcs: 64",
        "; Queue: 1 batch",
        "; Note: made up",
    ]
    back = read_swf(out)
    assert back.header.model_dump(exclude={"lines"}) == header.model_dump(exclude={"lines"})
    pd.testing.assert_frame_equal(back.jobs, jobs)


# --------------------------------------------------------------------------- malformed input

OK = "1 0 10 100 4 -1 -1 4 200 -1 1 -1 -1 -1 -1 -1 -1 -1"


def job(**values) -> str:
    tokens = OK.split()
    for name, value in values.items():
        tokens[FIELDS.index(name)] = str(value)
    return " ".join(tokens)


# (id, text, line, field, reason)
MALFORMED = [
    ("short_line", f"; MaxProcs: 10\n{OK}\n{' '.join(OK.split()[:17])}\n", 3, "think_time", "line has 17 fields, SWF needs 18"),
    ("one_field", f"{OK}\n42\n", 2, "submit_time", "line has 1 fields, SWF needs 18"),
    ("non_numeric", f"{OK}\n{job(run_time='abc')}\n", 2, "run_time", "'abc' is not a finite number"),
    ("nan", f"{job(wait_time='nan')}\n", 1, "wait_time", "'nan' is not a finite number"),
    ("inf_float_field", f"{job(average_cpu_time='inf')}\n", 1, "average_cpu_time", "'inf' is not a finite number"),
    ("negative", f"{OK}\n{OK}\n{job(run_time=-5)}\n", 3, "run_time", "negative value -5; SWF allows -1 (unknown) only"),
    ("negative_float", f"{job(average_cpu_time=-0.5)}\n", 1, "average_cpu_time", "negative value -0.5; SWF allows -1 (unknown) only"),
    ("non_integer", f"{OK}\n{job(wait_time=2.5)}\n", 2, "wait_time", "'2.5' is not an integer"),
    ("bad_header_integer", f"; UnixStartTime: 0\n; MaxProcs: many\n{OK}\n", 2, "MaxProcs", "header value 'many' is not an integer"),
    ("nineteen_fields", f"{OK} x\n", 1, None, "line has 19 fields, SWF has 18 (unexpected 'x')"),
    ("exponent_integer", f"{OK}\n{job(requested_memory='1e3')}\n", 2, "requested_memory", "'1e3' is not an integer"),
    ("rounds_to_integer", f"{job(submit_time='4503599627370496.5')}\n", 1, "submit_time", "'4503599627370496.5' is not an integer"),
    ("huge_integer", f"{OK}\n{job(requested_memory='99999999999999999999')}\n", 2, "requested_memory", "'99999999999999999999' is too large for a 64-bit integer"),
    ("huge_negative", f"{job(wait_time='-99999999999999999999')}\n", 1, "wait_time", "negative value -99999999999999999999; SWF allows -1 (unknown) only"),
    ("underscore", f"{job(run_time='1_000')}\n", 1, "run_time", "'1_000' is not a finite number"),
    (
        "nineteen_fields_braced",
        f"{OK} {{1,2}}\n",
        1,
        "node_ids",
        "line has 19 fields; Alea's extended SWF has 21 (18 + {node ids} queue properties)",
    ),
    ("bad_node_list", f"{OK} {{1,x}} q p\n", 1, "node_ids", "node list '{1,x}' is not comma-separated integers"),
    ("plain_after_extended", f"{OK} {{1}} q p\n{OK}\n", 2, "node_ids", "plain 18-field line in an extended SWF file"),
    ("extended_after_plain", f"{OK}\n{OK} {{1}} q p\n", 2, None, "extended line in a plain SWF file (earlier lines had 18 fields)"),
    ("repeated_job_id", f"{OK}\n{job(job_id=2)}\n{OK}\n", 3, "job_id", "job id 1 repeats line 1 (job ids must be unique)"),
    ("empty", "", None, None, "empty file: no header and no jobs"),
    ("blank_lines_only", "\n   \n\t\n", None, None, "empty file: no header and no jobs"),
    ("header_only", "; Version: 2.2\n; MaxProcs: 10\n", None, None, "no jobs: the file has only header lines"),
]


def where(prefix: str, line, field) -> str:
    return prefix + (f", line {line}" if line is not None else "") + (f", field {field!r}" if field is not None else "")


@pytest.mark.parametrize(("text", "line", "field", "reason"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_text(text, line, field, reason):
    with pytest.raises(SWFError) as excinfo:
        parse_swf(text)
    exc = excinfo.value
    assert str(exc) == f"{where('<swf text>', line, field)}: {reason}"
    assert (exc.path, exc.line, exc.field, exc.reason) == (None, line, field, reason)
    assert isinstance(exc, ValueError) and isinstance(exc, HPCError) and isinstance(exc, LabError)


@pytest.mark.parametrize(("text", "line", "field", "reason"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_file_names_the_path(tmp_path, text, line, field, reason):
    path = tmp_path / "bad.swf"
    path.write_text(text)
    with pytest.raises(SWFError) as excinfo:
        read_swf(path)
    exc = excinfo.value
    assert str(exc) == f"{where(str(path), line, field)}: {reason}"
    assert (exc.path, exc.line, exc.field) == (path, line, field)


def test_malformed_gz_file_names_the_path(tmp_path):
    path = tmp_path / "bad.swf.gz"
    path.write_bytes(gzip.compress(f"{OK}\n{job(run_time=-5)}\n".encode()))
    with pytest.raises(SWFError) as excinfo:
        read_swf(str(path))
    assert str(excinfo.value) == f"{path}, line 2, field 'run_time': negative value -5; SWF allows -1 (unknown) only"


def test_binary_file_is_not_text(tmp_path):
    path = tmp_path / "bin.swf"
    path.write_bytes(b"1 2 3\xff\xfe\n")
    with pytest.raises(SWFError) as excinfo:
        read_swf(path)
    assert str(excinfo.value) == f"{path}, line 1: not UTF-8 text (invalid start byte)"


def test_undecodable_byte_deep_in_a_large_file_names_its_line(tmp_path):
    path = tmp_path / "late.swf"
    good = OK + "\n"
    path.write_bytes((good * 20_000).encode() + b"1 \xff\n")  # past the decoder's first chunk
    with pytest.raises(SWFError) as excinfo:
        read_swf(path)
    assert excinfo.value.line == 20_001


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"1 0 10 100 4 -1 -1 4 200 -1 1 -1 -1 -1 -1 -1 -1 -1\n", "not a readable gzip file (BadGzipFile: Not a gzipped file (b'1 '))"),
        (gzip.compress((OK + "\n").encode() * 200)[:40], "not a readable gzip file (EOFError: Compressed file ended before the end-of-stream marker was reached)"),
    ],
    ids=["not_gzip", "truncated_gzip"],
)
def test_bad_gzip_is_an_swf_error(tmp_path, payload, reason):
    path = tmp_path / "bad.swf.gz"
    path.write_bytes(payload)
    with pytest.raises(SWFError) as excinfo:
        read_swf(path)
    assert str(excinfo.value) == f"{path}: {reason}"


def test_byte_order_mark_and_cr_line_ends(tmp_path):
    text = "\ufeff; MaxProcs: 8\r" + OK + "\r"
    assert parse_swf(text).header.max_procs == 8 and len(parse_swf(text)) == 1
    path = tmp_path / "bom.swf"
    path.write_bytes(text.encode("utf-8"))
    assert read_swf(path).header.max_procs == 8


def test_header_integer_out_of_range():
    with pytest.raises(SWFError) as excinfo:
        parse_swf("; UnixStartTime: " + "9" * 30 + "\n" + OK + "\n")
    assert excinfo.value.line == 1 and excinfo.value.field == "UnixStartTime"
    assert "out of range" in str(excinfo.value)


def test_non_swf_data_set_is_refused_by_name():
    with pytest.raises(SWFError, match="data set 'tau_bench_airline_trajectories' is json, not an SWF trace"):
        load_trace("tau_bench_airline_trajectories")


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_swf(tmp_path / "nope.swf")


def test_invalid_mode_is_checked():
    with pytest.raises(ArgumentError, match="read_swf: invalid='skip': must be 'raise' or 'unknown'") as info:
        parse_swf(OK, invalid="skip")
    assert info.value.field == "invalid" and isinstance(info.value, ValueError)


def test_first_bad_value_in_file_order_wins_over_column_order():
    # line 3's last field is bad, line 4's first field is bad: line 3 is reported
    text = "\n".join([OK, OK, job(think_time=-7), job(job_id="x", run_time=-9), job(submit_time=1.5)]) + "\n"
    with pytest.raises(SWFError) as excinfo:
        parse_swf(text)
    assert str(excinfo.value) == "<swf text>, line 3, field 'think_time': negative value -7; SWF allows -1 (unknown) only"
    # within one line, the earlier field
    with pytest.raises(SWFError) as excinfo:
        parse_swf(job(requested_time="y", wait_time=-3))
    assert (excinfo.value.line, excinfo.value.field) == (1, "wait_time")


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        (f"{OK}\n{job(run_time='abc')}\n{' '.join(OK.split()[:17])}\n", 2, "run_time"),  # bad value, then short line
        (f"{job(status=-2)}\n{OK} x\n", 1, "status"),  # bad value, then a 19-field line
        (f"{job(wait_time=0.5)}\n{OK}\n; late header\n", 1, "wait_time"),  # bad value, then header after jobs
        (f"; MaxProcs: many\n{OK}\n{' '.join(OK.split()[:10])}\n", 1, "MaxProcs"),  # bad header, then short line
        (f"{OK} {{1,x}} q p\n{job(run_time=-5)} {{1}} q p\n", 1, "node_ids"),  # bad node list, then bad value
        (f"{job(run_time=-5)} {{1}} q p\n{OK} {{1,x}} q p\n", 1, "run_time"),  # bad value, then bad node list
    ],
    ids=["value_then_short", "value_then_19", "value_then_header", "header_then_short", "nodes_then_value", "value_then_nodes"],
)
def test_first_bad_line_in_file_order_across_kinds_of_fault(text, line, field):
    with pytest.raises(SWFError) as excinfo:
        parse_swf(text)
    assert (excinfo.value.line, excinfo.value.field) == (line, field)


def test_invalid_unknown_keeps_values_as_unknown_but_structure_still_raises():
    text = f"{OK}\n{job(job_id=2, run_time='abc', status=-3)}\n{job(job_id=3, average_cpu_time=-2.5)}\n"
    t = parse_swf(text, invalid="unknown")
    assert len(t) == 3
    assert [(p.line, p.field) for p in t.problems] == [(2, "run_time"), (2, "status"), (3, "average_cpu_time")]
    assert str(t.problems[0]) == "<swf text>, line 2, field 'run_time': 'abc' is not a finite number; kept as unknown"
    assert t.jobs["run_time"].tolist() == [100, pd.NA, 100]
    assert t.jobs["status"].tolist() == [1, pd.NA, 1]
    assert t.jobs["average_cpu_time"].isna().tolist() == [True, True, True]  # -1 in OK, and the bad one
    # a structural fault is not a value: it raises even after forgiven values
    with pytest.raises(SWFError) as excinfo:
        parse_swf(text + " ".join(OK.split()[:17]) + "\n", invalid="unknown")
    assert str(excinfo.value) == "<swf text>, line 4, field 'think_time': line has 17 fields, SWF needs 18"


def test_valid_edge_values():
    text = (
        "; UnixStartTime: 100\n"
        "\n"
        f"  {job(average_cpu_time=0.25, run_time=0)}  \r\n"  # blank line, padding, CRLF
        f"{job(job_id=2, requested_memory='9007199254740993')}\n"  # beyond float64's exact integers
        "\t \n"
    )
    t = parse_swf(text)
    assert len(t) == 2
    assert t.jobs["average_cpu_time"].tolist() == [0.25, pd.NA]
    assert t.jobs["run_time"].tolist() == [0, 100]
    assert t.jobs["requested_memory"].tolist() == [pd.NA, 9007199254740993]
    assert t.submit_epoch().tolist() == [100.0, 100.0]
    assert t.path is None and t.name == "<swf>"


# --------------------------------------------------------------------------- property: write then read


@st.composite
def traces(draw):
    n = draw(st.integers(1, 12))
    ints = st.integers(-1, 2**63 - 1)  # -1 is unknown; integers are exact in int64
    floats = st.one_of(st.just(-1.0), st.floats(0, 1e15, allow_nan=False, allow_infinity=False))
    columns = {}
    for f in FIELDS:
        if f == "job_id":  # job numbers are unique (or unknown)
            values = draw(st.lists(ints, min_size=n, max_size=n, unique_by=lambda v: v if v != -1 else object()))
        else:
            values = draw(st.lists(floats if f == "average_cpu_time" else ints, min_size=n, max_size=n))
        columns[f] = pd.array([None if v == -1 else v for v in values], dtype="Float64" if f == "average_cpu_time" else "Int64")
    header = SWFHeader(
        unix_start_time=draw(st.integers(0, 2**31)), max_procs=draw(st.one_of(st.none(), st.integers(1, 10**6)))
    )
    text = st.text(st.characters(codec="ascii", exclude_categories=["Cc"]), max_size=20)
    positions = draw(st.lists(st.integers(1, n), max_size=3))  # comments between jobs or at the end (not before the first job)
    comments = tuple(SWFComment(line=0, text=";" + draw(text).rstrip(), before_job=k) for k in sorted(positions))
    return SWFTrace(jobs=pd.DataFrame(columns), header=header, comments=comments)


@pytest.mark.filterwarnings("ignore::lab.hpc.errors.SWFWarning")  # random processors may exceed MaxProcs, or comments look like header lines
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trace=traces(), gz=st.booleans())
def test_property_write_then_read_gives_the_same_table(tmp_path, trace, gz):
    out = write_swf(trace, tmp_path / ("p.swf.gz" if gz else "p.swf"))
    back = read_swf(out)
    pd.testing.assert_frame_equal(back.jobs, trace.jobs)
    assert back.header.model_dump(exclude={"lines"}) == trace.header.model_dump(exclude={"lines"})
    assert back.problems == ()
    assert [(c.text, c.before_job) for c in back.comments] == [(c.text, c.before_job) for c in trace.comments]
    # and once more from the re-read trace (verbatim header lines now): the file is identical
    again = write_swf(back, tmp_path / ("q.swf.gz" if gz else "q.swf"))
    opener = gzip.open if gz else open
    with opener(out, "rb") as a, opener(again, "rb") as b:
        assert a.read() == b.read()


def test_indented_header_lines_continue_the_previous_key_even_with_a_colon():
    text = "; Note: logs from the\n;       archive, see: http://example.org\n; MaxProcs: 8\n" + OK + "\n"
    header = parse_swf(text).header
    assert header.notes == ["logs from the archive, see: http://example.org"]
    assert header.max_procs == 8


# --------------------------------------------------------------------------- comments, repeated ids, oversized jobs (issue #16)


def _write(tmp_path, text: str, gz: bool) -> Path:
    path = tmp_path / ("t.swf.gz" if gz else "t.swf")
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return path


CONCATENATED = (
    "; Computer: first log\n; MaxProcs: 10\n"
    f"{job(job_id=1)}\n{job(job_id=2)}\n"
    "; ---- second log, appended by hand ----\n"
    "; MaxProcs: 99\n"
    f"{job(job_id=3)}\n"
    ";  trailing note\n"
)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_comment_lines_after_the_first_job_are_read_as_comments(tmp_path, gz):
    path = _write(tmp_path, CONCATENATED, gz)
    with pytest.warns(SWFWarning, match=r"line 6: '; MaxProcs: 99' comes after the first job, so it is kept as a comment"):
        t = read_swf(path)
    assert t.jobs["job_id"].tolist() == [1, 2, 3]
    assert t.header.max_procs == 10 and t.header.computer == "first log"  # header fields from the header block only
    assert t.header.lines == ["; Computer: first log", "; MaxProcs: 10"]
    assert t.comments == (
        SWFComment(line=5, text="; ---- second log, appended by hand ----", before_job=2),
        SWFComment(line=6, text="; MaxProcs: 99", before_job=2),
        SWFComment(line=8, text=";  trailing note", before_job=3),
    )
    # written back where they were
    out = write_swf(t, tmp_path / ("back.swf.gz" if gz else "back.swf"))
    assert (gzip.open(out, "rt") if gz else out.open()).read() == CONCATENATED


def test_a_plain_comment_after_the_first_job_does_not_warn(recwarn):
    t = parse_swf(f"; MaxProcs: 10\n{OK}\n; checked by hand: fine\n{job(job_id=2)}\n")
    assert [c.line for c in t.comments] == [3] and len(t) == 2
    assert not [w for w in recwarn if issubclass(w.category, SWFWarning)]


REPEATED = f"; MaxProcs: 10\n{job(job_id=1)}\n{job(job_id=2)}\n{job(job_id=1, run_time=7)}\n{job(job_id=3)}\n{job(job_id=2, run_time=8)}\n"


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_repeated_job_id_is_an_error_naming_the_id_and_both_lines(tmp_path, gz):
    path = _write(tmp_path, REPEATED, gz)
    with pytest.raises(SWFError) as excinfo:
        read_swf(path)
    exc = excinfo.value
    assert str(exc) == f"{path}, line 4, field 'job_id': job id 1 repeats line 2 (job ids must be unique)"
    assert (exc.line, exc.field) == (4, "job_id")


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_repeated_job_id_with_invalid_unknown_drops_the_later_job(tmp_path, gz):
    path = _write(tmp_path, REPEATED + "; end\n", gz)
    t = read_swf(path, invalid="unknown")
    assert t.jobs["job_id"].tolist() == [1, 2, 3] and t.jobs["run_time"].tolist() == [100, 100, 100]
    assert [(p.line, p.field) for p in t.problems] == [(4, "job_id"), (6, "job_id")]
    assert str(t.problems[1]) == f"{path}, line 6, field 'job_id': job id 2 repeats line 3; this later job was dropped"
    assert [(c.line, c.before_job) for c in t.comments] == [(7, 3)]  # positions counted in the jobs kept
    running = QueueReplay(t).running_jobs(15)  # all three run [10, 110): each listed once
    assert running["job_id"].tolist() == [1, 2, 3]


def test_unknown_job_ids_are_not_repeats():
    t = parse_swf(f"{job(job_id=-1)}\n{job(job_id=-1)}\n")
    assert t.jobs["job_id"].isna().tolist() == [True, True] and t.problems == ()


OVERSIZED = f"; MaxNodes: 8\n{job(job_id=1)}\n{job(job_id=2, allocated_processors=16, requested_processors=16)}\n{job(job_id=3)}\n"


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_job_larger_than_the_machine_warns_naming_its_line_and_the_limit(tmp_path, gz):
    path = _write(tmp_path, OVERSIZED, gz)
    with pytest.warns(SWFWarning) as caught:
        t = read_swf(path)
    [w] = caught
    assert str(w.message) == (
        f"{path}, line 3: job 2 has allocated_processors = 16, more than the header's MaxNodes: 8 (a replay of this trace goes over capacity)"
    )
    assert (w.message.path, w.message.lines, w.message.field) == (path, (3,), "allocated_processors")
    assert len(t) == 3  # still read
    # and the replay never shows a negative free capacity without saying why
    r = QueueReplay(t)
    snap = r.snapshot(50)
    assert (snap.busy_processors, snap.free_processors, snap.over_capacity_processors) == (24, 0, 16) and snap.over_capacity
    assert snap.utilization == 3.0
    assert r.capacity_violations()["busy_processors"].tolist() == [24]


def test_requested_processors_over_max_procs_warn_too():
    with pytest.warns(SWFWarning, match=r"line 2: job 9 has requested_processors = 12, more than the header's MaxProcs: 10"):
        parse_swf(f"; MaxProcs: 10\n{job(job_id=9, allocated_processors=-1, requested_processors=12)}\n")


def test_jobs_within_the_machine_do_not_warn(recwarn):
    parse_swf(f"; MaxProcs: 4\n{job(job_id=1)}\n")  # OK uses 4 of 4
    parse_swf(f"{job(job_id=1, allocated_processors=10**6)}\n")  # no header: no machine to exceed
    assert not [w for w in recwarn if issubclass(w.category, SWFWarning)]
