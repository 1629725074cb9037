"""LocalStorage and S3Storage: atomic writes, listing, errors (S3 against a moto server)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import boto3
import pytest
from gpuflow.tasks.training.storage import (
    BucketNotFoundError,
    CheckpointStore,
    CredentialsRefusedError,
    LocalStorage,
    ObjectNotFoundError,
    S3Storage,
)

MIB = 1 << 20


# -- local ----------------------------------------------------------------------------------


def test_local_round_trip_list_delete(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path / "root")
    assert isinstance(store, CheckpointStore)
    store.put_bytes("job/a/one.pt", b"1")
    store.put_bytes("job/a/two.pt", memoryview(b"22"))
    store.put_bytes("job/b/three.pt", bytearray(b"333"))
    store.put_bytes("other/x", b"x")

    assert store.get_bytes("job/a/two.pt") == b"22"
    assert store.list("job/") == ["job/a/one.pt", "job/a/two.pt", "job/b/three.pt"]
    assert store.list("job/a/") == ["job/a/one.pt", "job/a/two.pt"]
    assert store.list("job/a/t") == ["job/a/two.pt"]
    assert store.list("nothing/") == []
    assert store.exists("job/b/three.pt") and not store.exists("job/b/none")

    store.delete("job/b/three.pt")
    store.delete("job/b/three.pt")  # deleting twice is fine, as on S3
    assert not (tmp_path / "root" / "job" / "b").exists()  # the empty folder went too
    assert (tmp_path / "root").is_dir()
    with pytest.raises(ObjectNotFoundError, match="job/b/three.pt"):
        store.get_bytes("job/b/three.pt")


def test_local_replace_is_whole_and_files_round_trip(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path)
    store.put_bytes("k", b"old")
    store.put_bytes("k", b"new value")
    assert store.get_bytes("k") == b"new value"

    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 * MIB + 7))
    store.put_file("copied/src.bin", src)
    dest = tmp_path / "dest.bin"
    store.get_file("copied/src.bin", dest)
    assert dest.read_bytes() == src.read_bytes()
    with pytest.raises(ObjectNotFoundError):
        store.get_file("copied/none", dest)


def test_local_failed_write_keeps_previous_object_and_leaves_no_temp(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path)
    store.put_bytes("job/ckpt.pt", b"committed")
    with pytest.raises(RuntimeError, match="writer died"):
        with store.open_write("job/ckpt.pt") as handle:
            handle.write(b"half of the new")
            raise RuntimeError("writer died")
    assert store.get_bytes("job/ckpt.pt") == b"committed"
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == ["ckpt.pt"]


def test_local_crash_leftover_temp_is_not_an_object(tmp_path: Path) -> None:
    # A process killed between writing the temp file and the rename leaves the temp file.
    store = LocalStorage(tmp_path)
    store.put_bytes("job/ckpt.pt", b"committed")
    (tmp_path / "job" / ".ckpt.pt.tmp-deadbeef").write_bytes(b"partial")
    assert store.list("job/") == ["job/ckpt.pt"]
    assert store.get_bytes("job/ckpt.pt") == b"committed"


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "./a", "a\\b", "x.tmp-1"])
def test_local_rejects_bad_keys(tmp_path: Path, key: str) -> None:
    store = LocalStorage(tmp_path / "root")
    with pytest.raises(ValueError, match="key"):
        store.put_bytes(key, b"x")
    assert list((tmp_path / "root").iterdir()) == []


def test_local_root_must_be_a_folder(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(Exception, match="not a folder"):
        LocalStorage(tmp_path / "file")


# -- S3 -------------------------------------------------------------------------------------


def test_s3_round_trip_with_prefix(s3_bucket: S3Storage, s3_server: str) -> None:
    store = s3_bucket
    assert isinstance(store, CheckpointStore)
    store.put_bytes("job/a/one.pt", b"1")
    with store.open_write("job/a/two.pt") as handle:
        handle.write(b"2")
        handle.write(memoryview(b"2"))
    assert store.get_bytes("job/a/two.pt") == b"22"
    assert store.list("job/") == ["job/a/one.pt", "job/a/two.pt"]
    assert store.exists("job/a/one.pt") and not store.exists("job/a/none")

    # The prefix is where the objects really are in the bucket.
    raw = boto3.client("s3", endpoint_url=s3_server)
    listed = raw.list_objects_v2(Bucket=store.bucket)["Contents"]
    assert sorted(o["Key"] for o in listed) == ["runs/job/a/one.pt", "runs/job/a/two.pt"]

    store.delete("job/a/one.pt")
    assert store.list("job/") == ["job/a/two.pt"]
    with pytest.raises(ObjectNotFoundError, match="job/a/one.pt"):
        store.get_bytes("job/a/one.pt")


def test_s3_large_objects_go_up_in_parts(s3_bucket: S3Storage, s3_server: str, tmp_path: Path):
    payload = os.urandom(11 * MIB + 123)  # threshold and part 5 MiB: three parts
    s3_bucket.put_bytes("big/bytes.pt", payload)
    with s3_bucket.open_write("big/stream.pt") as handle:
        for start in range(0, len(payload), MIB):
            handle.write(payload[start : start + MIB])
    src = tmp_path / "src.bin"
    src.write_bytes(payload)
    s3_bucket.put_file("big/file.pt", src)

    raw = boto3.client("s3", endpoint_url=s3_server)
    for key in ("big/bytes.pt", "big/stream.pt", "big/file.pt"):
        head = raw.head_object(Bucket=s3_bucket.bucket, Key=f"runs/{key}")
        assert head["ETag"].strip('"').endswith("-3"), (key, head["ETag"])  # multipart ETag
        assert head["ContentLength"] == len(payload)
        assert s3_bucket.get_bytes(key) == payload
    dest = tmp_path / "dest.bin"
    s3_bucket.get_file("big/file.pt", dest)
    assert dest.read_bytes() == payload

    small = b"x" * 1000
    s3_bucket.put_bytes("small.pt", small)
    head = raw.head_object(Bucket=s3_bucket.bucket, Key="runs/small.pt")
    assert "-" not in head["ETag"]


def test_s3_missing_bucket_is_named(s3_server: str) -> None:
    with pytest.raises(BucketNotFoundError, match="'no-such-bucket-here' does not exist"):
        S3Storage("no-such-bucket-here", endpoint_url=s3_server)


def test_s3_refused_credentials(s3_bucket: S3Storage, s3_server: str, s3_auth_key) -> None:
    key_id, secret = s3_auth_key
    # The real key works while the server enforces auth: the refusals below are real ones.
    good = S3Storage(
        s3_bucket.bucket, endpoint_url=s3_server, access_key_id=key_id, secret_access_key=secret
    )
    good.put_bytes("auth/ok", b"ok")
    assert good.get_bytes("auth/ok") == b"ok"

    with pytest.raises(CredentialsRefusedError, match="refused the credentials") as wrong_secret:
        S3Storage(
            s3_bucket.bucket,
            endpoint_url=s3_server,
            access_key_id=key_id,
            secret_access_key="not-the-secret-9f8e7d",
        )
    assert "SignatureDoesNotMatch" in str(wrong_secret.value)
    assert "not-the-secret-9f8e7d" not in str(wrong_secret.value)

    with pytest.raises(CredentialsRefusedError, match="InvalidAccessKeyId") as unknown:
        S3Storage(
            s3_bucket.bucket,
            endpoint_url=s3_server,
            access_key_id="AKIAUNKNOWN000000000",
            secret_access_key="hush-hush-1234",
        )
    assert "AKIAUNKNOWN000000000" in str(unknown.value)
    assert "hush-hush-1234" not in str(unknown.value)

    # Refused on a later call too (verify=False skips the check at construction).
    late = S3Storage(
        s3_bucket.bucket,
        endpoint_url=s3_server,
        access_key_id="AKIAUNKNOWN000000000",
        secret_access_key="hush-hush-1234",
        verify=False,
    )
    with pytest.raises(CredentialsRefusedError):
        late.put_bytes("auth/no", b"no")
    with pytest.raises(CredentialsRefusedError):
        late.list("auth/")


def test_s3_bad_settings_refused_before_any_call() -> None:
    with pytest.raises(ValueError, match="at least 5"):
        S3Storage("bucket", multipart_chunk_mb=4, verify=False)
    with pytest.raises(ValueError, match="both access_key_id and secret_access_key"):
        S3Storage("bucket", access_key_id="AKIA", verify=False)
    with pytest.raises(ValueError, match="bucket"):
        S3Storage("", verify=False)


def test_s3_secret_not_in_repr() -> None:
    store = S3Storage(
        "bucket",
        access_key_id="AKIA1",
        secret_access_key="s3cr3t-v4lue",
        endpoint_url="http://127.0.0.1:1",
        verify=False,
    )
    assert "s3cr3t-v4lue" not in repr(store)
    assert "AKIA1" in repr(store)


def test_s3_a_pickled_store_reaches_the_same_bucket_with_its_settings(
    s3_bucket: S3Storage,
) -> None:
    # A gang's ranks get the store through the agent's spawn pipe (pickled): each opens its
    # own client, with the same bucket, prefix and part sizes.
    s3_bucket.put_bytes("job/pickled.pt", b"before")
    copy = pickle.loads(pickle.dumps(s3_bucket))
    assert copy.get_bytes("job/pickled.pt") == b"before"
    copy.put_bytes("job/pickled.pt", b"after")
    assert s3_bucket.get_bytes("job/pickled.pt") == b"after"
    assert (copy.prefix, copy.multipart_chunk_mb, copy.multipart_threshold_mb) == (
        s3_bucket.prefix,
        s3_bucket.multipart_chunk_mb,
        s3_bucket.multipart_threshold_mb,
    )
    assert copy._client is not s3_bucket._client
