"""lab.hpc.transfer: the local copier (checksums, resume, retries) and the Globus backend, offline."""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
from pathlib import Path

import globus_sdk
import pytest
import responses
from globus_sdk import TransferClient
from globus_sdk.testing import RegisteredResponse, ResponseList, get_last_request, load_response
from globus_sdk.transport import RetryConfig

from lab import LabError
from lab.hpc.errors import HPCError, TransferError
from lab.hpc.transfer import (
    GlobusTransfer,
    LocalTransfer,
    TransferBackend,
    TransferItem,
    TransferRequest,
    TransferState,
    TransferStatus,
    sha256_file,
)

MiB = 1024 * 1024


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _flip_first_byte(dest: Path, offset: int, chunk: bytes) -> bytes:
    return bytes([chunk[0] ^ 0xFF]) + chunk[1:] if offset == 0 else chunk


@pytest.fixture
def sites(tmp_path: Path) -> tuple[Path, Path, bytes]:
    """Two endpoint roots; the source holds in/data.bin (3 MiB + 123 bytes of seeded random data)."""
    src, dst = tmp_path / "site-a", tmp_path / "site-b"
    (src / "in").mkdir(parents=True)
    dst.mkdir()
    data = random.Random(7).randbytes(3 * MiB + 123)
    (src / "in" / "data.bin").write_bytes(data)
    return src, dst, data


def _request(src: Path, dst: Path, **kw) -> TransferRequest:
    return TransferRequest(source_endpoint=str(src), destination_endpoint=str(dst), items=[("/in/data.bin", "/out/data.bin")], **kw)


@pytest.fixture
def local():
    backends: list[LocalTransfer] = []

    def make(**kw) -> LocalTransfer:
        kw.setdefault("chunk_size", 256 * 1024)
        b = LocalTransfer(**kw)
        backends.append(b)
        return b

    yield make
    for b in backends:
        b.close()


# --------------------------------------------------------------------------- types


def test_request_accepts_pairs_and_validates():
    req = TransferRequest(source_endpoint="a", destination_endpoint="b", items=[("/x", "/y"), {"source_path": "/d", "destination_path": "/e", "recursive": True}])
    assert req.items == [TransferItem(source_path="/x", destination_path="/y"), TransferItem(source_path="/d", destination_path="/e", recursive=True)]
    assert req.verify_checksum is True and req.effective_sync_level == "checksum"
    assert TransferRequest(source_endpoint="a", destination_endpoint="b", items=[("/x", "/y")], verify_checksum=False).effective_sync_level is None
    with pytest.raises(ValueError):
        TransferRequest(source_endpoint="a", destination_endpoint="b", items=[])
    assert issubclass(TransferError, HPCError) and issubclass(TransferError, LabError)
    assert isinstance(LocalTransfer(), TransferBackend)


# --------------------------------------------------------------------------- local


def test_local_copy_verifies_sha256(sites, local):
    src, dst, data = sites
    backend = local()
    task_id = backend.submit(_request(src, dst, label="copy one"))
    st = backend.wait(task_id, timeout_s=30)
    out = dst / "out" / "data.bin"
    assert st.state is TransferState.SUCCEEDED and st.ok and st.done
    assert sha256_file(out) == _sha(data) == sha256_file(src / "in" / "data.bin")
    assert st.bytes_transferred == st.bytes_expected == len(data)
    assert (st.files, st.files_transferred, st.faults, st.resumed_from_bytes) == (1, 1, 0, 0)
    assert st.checksum_verified is True and st.error is None and st.label == "copy one"
    assert st.checksums == {str(out.resolve()): _sha(data)}
    assert st.request_time <= st.completion_time and st.bytes_per_s > 0
    assert not out.with_name("data.bin.part").exists()
    assert backend.status(task_id) == st


def test_local_resumes_a_partial_copy(sites, local):
    src, dst, data = sites
    part = dst / "out" / "data.bin.part"
    part.parent.mkdir()
    part.write_bytes(data[: 2 * MiB])
    st = local().run(_request(src, dst), timeout_s=30)
    assert st.resumed_from_bytes == 2 * MiB
    assert st.bytes_transferred == len(data) - 2 * MiB
    assert (dst / "out" / "data.bin").read_bytes() == data
    assert not part.exists()


@pytest.mark.parametrize("bad", ["flipped", "longer"])
def test_local_discards_a_part_that_is_not_a_prefix(sites, local, bad):
    src, dst, data = sites
    part = dst / "out" / "data.bin.part"
    part.parent.mkdir()
    stale = bytearray(data[: 2 * MiB]) if bad == "flipped" else bytearray(data + b"junk")
    stale[1000] ^= 0x01 if bad == "flipped" else 0x00
    part.write_bytes(bytes(stale))
    st = local().run(_request(src, dst), timeout_s=30)
    assert st.resumed_from_bytes == 0
    assert st.bytes_transferred == len(data)
    assert (dst / "out" / "data.bin").read_bytes() == data


def test_local_transient_mismatch_is_retried(sites, local):
    src, dst, data = sites
    calls = {"corrupted": 0}

    def corrupt_once(dest: Path, offset: int, chunk: bytes) -> bytes:
        if offset == 0 and calls["corrupted"] == 0:
            calls["corrupted"] += 1
            return _flip_first_byte(dest, offset, chunk)
        return chunk

    st = local(chunk_hook=corrupt_once, retries=2).run(_request(src, dst), timeout_s=30)
    assert st.ok and st.faults == 1 and st.checksum_verified is True
    assert st.bytes_transferred == 2 * len(data)  # the refused attempt moved its bytes too
    assert (dst / "out" / "data.bin").read_bytes() == data


def test_local_persistent_mismatch_fails_with_both_digests(sites, local):
    src, dst, data = sites
    backend = local(chunk_hook=_flip_first_byte, retries=2)
    task_id = backend.submit(_request(src, dst))
    st = backend.wait(task_id, timeout_s=30)
    bad = bytes([data[0] ^ 0xFF]) + data[1:]
    assert st.state is TransferState.FAILED and st.checksum_verified is False
    assert st.faults == 3 and st.files_transferred == 0
    assert "data.bin" in st.error and _sha(data) in st.error and _sha(bad) in st.error
    out = dst / "out" / "data.bin"
    assert not out.exists() and not out.with_name("data.bin.part").exists()
    with pytest.raises(TransferError, match=_sha(data)) as info:
        backend.run(_request(src, dst), timeout_s=30)
    assert info.value.status.state is TransferState.FAILED
    assert not out.exists()


def test_local_missing_source_names_the_path(sites, local):
    src, dst, _ = sites
    req = TransferRequest(source_endpoint=str(src), destination_endpoint=str(dst), items=[("/in/nope.bin", "/out/nope.bin")])
    with pytest.raises(TransferError, match=r"in/nope\.bin"):
        local().submit(req)
    with pytest.raises(TransferError, match="not an existing local directory"):
        local().submit(TransferRequest(source_endpoint=str(src / "missing"), destination_endpoint=str(dst), items=[("a", "b")]))
    with pytest.raises(TransferError, match="leaves its endpoint"):
        local().submit(TransferRequest(source_endpoint=str(src), destination_endpoint=str(dst), items=[("/in/data.bin", "../escape.bin")]))
    with pytest.raises(TransferError, match="no local transfer task"):
        local().status("not-a-task")


def test_local_symbolic_links_do_not_leave_an_endpoint(sites, local, tmp_path):
    src, dst, _ = sites
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host file")
    os.symlink(outside, src / "in" / "link")  # a link inside the source endpoint pointing out of it
    os.symlink(outside, dst / "link")
    with pytest.raises(TransferError, match="leaves its endpoint") as exc:
        local().submit(TransferRequest(source_endpoint=str(src), destination_endpoint=str(dst), items=[("/in/link/secret.txt", "/got.txt")]))
    assert "resolves to" in str(exc.value)
    with pytest.raises(TransferError, match="leaves its endpoint"):
        local().submit(TransferRequest(source_endpoint=str(src), destination_endpoint=str(dst), items=[("/in/data.bin", "link/planted.bin")]))
    os.symlink(outside / "secret.txt", src / "in" / "file-link.txt")  # a file link below a folder copied recursively
    with pytest.raises(TransferError, match="outside its endpoint"):
        local().submit(TransferRequest(source_endpoint=str(src), destination_endpoint=str(dst), items=[TransferItem(source_path="/in", destination_path="/copy", recursive=True)]))
    assert not (dst / "got.txt").exists() and not (outside / "planted.bin").exists() and not (dst / "copy").exists()


def test_local_recursive_directory(sites, local):
    src, dst, data = sites
    (src / "in" / "sub").mkdir()
    (src / "in" / "sub" / "small.txt").write_text("hello")
    with pytest.raises(TransferError, match="recursive"):
        local().submit(TransferRequest(source_endpoint=str(src), destination_endpoint=str(dst), items=[("/in", "/copy")]))
    req = TransferRequest(source_endpoint=str(src), destination_endpoint=str(dst), items=[TransferItem(source_path="/in", destination_path="/copy", recursive=True)])
    st = local().run(req, timeout_s=30)
    assert st.files == st.files_transferred == 2
    assert (dst / "copy" / "data.bin").read_bytes() == data
    assert (dst / "copy" / "sub" / "small.txt").read_text() == "hello"


def test_local_wait_timeout_reports_progress(sites, local):
    src, dst, data = sites
    release = threading.Event()

    def slow(dest: Path, offset: int, chunk: bytes) -> bytes:
        if offset > 0:
            release.wait(10)
        return chunk

    backend = local(chunk_hook=slow)
    task_id = backend.submit(_request(src, dst))
    st = backend.wait(task_id, timeout_s=0.2)  # a timeout returns the last status
    assert st.state is TransferState.ACTIVE and not st.done
    assert 0 < st.bytes_transferred < len(data)
    assert not (dst / "out" / "data.bin").exists()  # nothing in place before verification
    with pytest.raises(TransferError, match="still active") as info:
        backend.run(TransferRequest(source_endpoint=str(src), destination_endpoint=str(dst), items=[("/in/data.bin", "/out/other.bin")]), timeout_s=0.1)
    assert info.value.status.state in (TransferState.PENDING, TransferState.ACTIVE)
    release.set()
    assert backend.wait(task_id, timeout_s=30).ok


def test_local_estimate_is_linear_and_learns_bandwidth(sites, local):
    fixed = local(bandwidth_bytes_per_s=100e6, latency_s=0.5)
    assert fixed.estimate_s(0) == pytest.approx(0.5)
    assert fixed.estimate_s(100e6) == pytest.approx(1.5)
    e1, e2, e4 = fixed.estimate_s(1e6), fixed.estimate_s(2e6), fixed.estimate_s(4e6)
    assert e2 - e1 == pytest.approx(e1 - fixed.estimate_s(0)) and e4 - e2 == pytest.approx(2 * (e2 - e1))
    with pytest.raises(ValueError):
        fixed.estimate_s(-1)

    src, dst, data = sites
    learner = local(default_bandwidth_bytes_per_s=1.0)  # an absurd prior, replaced by the measurement
    assert learner.measured_bandwidth_bytes_per_s is None and learner.bandwidth_bytes_per_s() == 1.0
    learner.run(_request(src, dst), timeout_s=30)
    measured = learner.measured_bandwidth_bytes_per_s
    assert measured is not None and measured > 1e6
    assert learner.bandwidth_bytes_per_s() == measured
    assert learner.estimate_s(2 * len(data)) - learner.estimate_s(len(data)) == pytest.approx(len(data) / measured)


# --------------------------------------------------------------------------- globus (offline)

SRC_COLLECTION = "aa752cea-8222-5bc8-acd9-555b090c0ccb"
DST_COLLECTION = "313ce13e-b597-5858-ae13-29e46fea26e6"
TASK = "42277910-0c18-11ee-83ce-0d4cd8a1bd91"


@pytest.fixture
def mocked():
    responses.start()
    try:
        yield
    finally:
        responses.stop()
        responses.reset()


@pytest.fixture
def tc(mocked) -> TransferClient:
    # no retries: an unregistered URL must fail at once, not back off
    return TransferClient(authorizer=globus_sdk.NullAuthorizer(), retry_config=RetryConfig(max_retries=0))


def _task_doc(status: str, **over) -> dict:
    doc = {
        "DATA_TYPE": "task",
        "task_id": TASK,
        "type": "TRANSFER",
        "label": "lab move",
        "status": status,
        "nice_status": {"ACTIVE": "Queued", "SUCCEEDED": None, "FAILED": None, "INACTIVE": "PAUSED_BY_ADMIN"}[status],
        "source_endpoint_id": SRC_COLLECTION,
        "destination_endpoint_id": DST_COLLECTION,
        "request_time": "2024-05-01T12:00:00+00:00",
        "completion_time": None,
        "bytes_transferred": 0,
        "files": 2,
        "files_transferred": 0,
        "files_skipped": 0,
        "faults": 0,
        "verify_checksum": True,
        "sync_level": 3,
        "fatal_error": None,
        "is_ok": True,
        "effective_bytes_per_second": 0,
    }
    doc.update(over)
    return doc


def _register_task(*docs: dict, status: int = 200) -> None:
    ResponseList(*(RegisteredResponse(service="transfer", path=f"/v0.10/task/{TASK}", json=d, status=status) for d in docs)).add()


def _task_calls() -> int:
    return sum(1 for c in responses.calls if c.request.url.split("?")[0].endswith(f"/v0.10/task/{TASK}"))


def _globus_request(**kw) -> TransferRequest:
    return TransferRequest(
        source_endpoint=SRC_COLLECTION,
        destination_endpoint=DST_COLLECTION,
        items=[("/~/in/a.bin", "/scratch/in/a.bin"), TransferItem(source_path="/~/in/dir", destination_path="/scratch/in/dir", recursive=True)],
        label="lab move",
        **kw,
    )


def test_globus_submit_sends_checksummed_transfer(tc):
    meta = load_response(TransferClient.submit_transfer).metadata
    load_response(TransferClient.get_submission_id)
    task_id = GlobusTransfer(tc).submit(_globus_request())
    assert task_id == meta["task_id"]
    sent = get_last_request()
    assert sent.method == "POST" and sent.url.endswith("/v0.10/transfer")
    body = json.loads(sent.body)
    assert body["DATA_TYPE"] == "transfer"
    assert body["source_endpoint"] == SRC_COLLECTION and body["destination_endpoint"] == DST_COLLECTION
    assert body["verify_checksum"] is True and body["sync_level"] == 3
    assert body["label"] == "lab move" and body["submission_id"] == meta["submission_id"]
    assert [(i["DATA_TYPE"], i["source_path"], i["destination_path"], i.get("recursive")) for i in body["DATA"]] == [
        ("transfer_item", "/~/in/a.bin", "/scratch/in/a.bin", None),
        ("transfer_item", "/~/in/dir", "/scratch/in/dir", True),
    ]
    assert [c.request.url.split("?")[0].rsplit("/", 1)[-1] for c in responses.calls] == ["submission_id", "transfer"]


def test_globus_submit_without_verification(tc):
    load_response(TransferClient.submit_transfer)
    load_response(TransferClient.get_submission_id)
    GlobusTransfer(tc).submit(_globus_request(verify_checksum=False))
    body = json.loads(get_last_request().body)
    assert body["verify_checksum"] is False and "sync_level" not in body


def test_globus_api_errors_become_transfer_errors(tc):
    load_response(TransferClient.submit_transfer, case="failure")
    load_response(TransferClient.get_submission_id)
    with pytest.raises(TransferError, match="400") as info:
        GlobusTransfer(tc).submit(_globus_request())
    assert info.value.http_status == 400 and info.value.code == "ClientError.BadRequest.NoTransferItems"
    assert isinstance(info.value.__cause__, globus_sdk.TransferAPIError)

    RegisteredResponse(
        service="transfer",
        path=f"/v0.10/task/{TASK}",
        status=403,
        json={"code": "PermissionDenied", "message": "You do not have permission to view this task", "request_id": "abc", "resource": f"/v0.10/task/{TASK}"},
    ).add()
    with pytest.raises(TransferError, match="HTTP 403 PermissionDenied") as info:
        GlobusTransfer(tc).status(TASK)
    assert (info.value.http_status, info.value.code) == (403, "PermissionDenied")


def test_globus_status_mapping(tc):
    _register_task(
        _task_doc("ACTIVE"),
        _task_doc("ACTIVE", nice_status="OK", bytes_transferred=1000, files_transferred=1),
        _task_doc("INACTIVE"),
        _task_doc(
            "SUCCEEDED",
            bytes_transferred=4_000_000,
            files_transferred=2,
            faults=1,
            completion_time="2024-05-01T12:00:08Z",
            effective_bytes_per_second=500_000,
        ),
    )
    g = GlobusTransfer(tc, latency_s=2.0, default_bandwidth_bytes_per_s=1e9)
    queued, moving, paused, done = (g.status(TASK) for _ in range(4))
    assert queued.state is TransferState.PENDING and queued.detail == "Queued"
    assert moving.state is TransferState.ACTIVE and moving.bytes_transferred == 1000 and moving.files_transferred == 1
    assert paused.state is TransferState.PENDING and paused.detail == "PAUSED_BY_ADMIN"
    assert isinstance(done, TransferStatus) and done.ok
    assert (done.bytes_transferred, done.files, done.files_transferred, done.faults) == (4_000_000, 2, 2, 1)
    assert done.checksum_verified is True and done.error is None and done.label == "lab move"
    assert done.request_time == 1714564800.0 and done.completion_time == 1714564808.0
    # the measured throughput replaces the default in the estimate
    assert g.measured_bandwidth_bytes_per_s == pytest.approx(500_000)
    assert g.estimate_s(1_000_000) == pytest.approx(2.0 + 2.0)


def test_globus_wait_polls_until_succeeded(tc):
    _register_task(_task_doc("ACTIVE"), _task_doc("ACTIVE", nice_status="OK"), _task_doc("SUCCEEDED", bytes_transferred=10, files_transferred=2))
    sleeps: list[float] = []
    st = GlobusTransfer(tc, sleep=sleeps.append).wait(TASK, timeout_s=60, poll_s=5)
    assert st.state is TransferState.SUCCEEDED and st.files_transferred == 2
    assert _task_calls() == 3 and sleeps == [5, 5]


def test_globus_wait_times_out(tc):
    _register_task(_task_doc("ACTIVE", nice_status="OK"))
    st = GlobusTransfer(tc, sleep=lambda s: None).wait(TASK, timeout_s=0, poll_s=0)
    assert st.state is TransferState.ACTIVE and not st.done and _task_calls() == 1


def test_globus_checksum_fault_fails_the_task(tc):
    failed = _task_doc(
        "FAILED",
        nice_status="VERIFY_CHECKSUM",
        nice_status_short_description="checksum verification failed",
        faults=4,
        fatal_error={"code": "VERIFY_CHECKSUM", "description": "checksum verification failed"},
        completion_time="2024-05-01T12:05:00+00:00",
    )
    _register_task(failed)
    st = GlobusTransfer(tc, sleep=lambda s: None).wait(TASK, timeout_s=5, poll_s=0)
    assert st.state is TransferState.FAILED and st.checksum_verified is False
    assert "checksum" in st.error and "VERIFY_CHECKSUM" in st.error and st.faults == 4


def test_globus_active_checksum_fault(tc):
    _register_task(_task_doc("ACTIVE", nice_status="VERIFY_CHECKSUM", faults=1))
    strict = GlobusTransfer(tc).status(TASK)
    assert strict.state is TransferState.FAILED and "VERIFY_CHECKSUM" in strict.error
    patient = GlobusTransfer(tc, fail_on_checksum_fault=False).status(TASK)
    assert patient.state is TransferState.ACTIVE and patient.checksum_verified is False and patient.error is None


def test_globus_failure_reason_from_events(tc):
    _register_task(_task_doc("FAILED", fatal_error={"code": "CANCELED", "description": "canceled"}))
    RegisteredResponse(
        service="transfer",
        path=f"/v0.10/task/{TASK}/event_list",
        json={
            "DATA_TYPE": "event_list",
            "limit": 10,
            "offset": 0,
            "total": 1,
            "DATA": [
                {
                    "DATA_TYPE": "event",
                    "code": "VERIFY_CHECKSUM",
                    "is_error": True,
                    "description": "checksum verification failed",
                    "details": "Checksum mismatch on /scratch/in/a.bin",
                    "time": "2024-05-01T12:04:00+00:00",
                }
            ],
        },
    ).add()
    st = GlobusTransfer(tc).status(TASK)
    assert st.state is TransferState.FAILED and st.checksum_verified is False
    assert "VERIFY_CHECKSUM" in st.error and "/scratch/in/a.bin" in st.error
    events_call = get_last_request()
    assert "/event_list" in events_call.url and "filter=is_error%3A1" in events_call.url


def test_globus_run_raises_on_failure(tc):
    task_id = load_response(TransferClient.submit_transfer).metadata["task_id"]
    load_response(TransferClient.get_submission_id)
    failed = _task_doc("FAILED", task_id=task_id, nice_status="VERIFY_CHECKSUM", faults=2)
    RegisteredResponse(service="transfer", path=f"/v0.10/task/{task_id}", json=failed).add()
    with pytest.raises(TransferError, match="checksum verification failed") as info:
        GlobusTransfer(tc, sleep=lambda s: None).run(_globus_request(), timeout_s=5, poll_s=0)
    assert info.value.status.task_id == task_id and info.value.status.state is TransferState.FAILED


def test_continuation_service_reports_a_watched_transfer_once(tmp_path):
    """A transfer's end reaches the event log through the service, exactly once, and resumes a continuation."""
    from lab.hpc.continuation import ContinuationService, Continuations, transfer_key

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "in.bin").write_bytes(os.urandom(256 * 1024))
    db = tmp_path / "lab.db"
    with LocalTransfer() as backend:
        agent = Continuations(db)
        service = ContinuationService(db, {}, transfer=backend, queue_every_s=None)
        task = backend.submit(TransferRequest(source_endpoint=str(src), destination_endpoint=str(dst), items=[("in.bin", "in.bin")]))
        agent.watch_transfer("alpha", task)
        agent.watch_transfer("alpha", task)  # idempotent
        cid = agent.register(transfer_key(task), "tests.continuation_handlers:record", args={"path": str(tmp_path / "calls.txt")})
        backend.wait(task, timeout_s=30, poll_s=0.01)
        service.poll_once()
        service.poll_once()  # nothing new the second time
        assert [e.kind for e in agent.log.tail(key=transfer_key(task))] == ["transfer.succeeded"]
        assert [r.id for r in agent.resume_ready()] == [cid] and agent.resume_ready() == []
        assert agent.get(cid).result["kind"] == "transfer.succeeded"
        service.close()
        agent.close()
