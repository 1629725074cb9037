"""Where checkpoint bytes live: a local folder or any S3-compatible object store.

A store maps string keys ("job/step-000000100/model.pt") to immutable blobs. Every write
is atomic: a reader sees either the whole new object or nothing (the previous object, if
any). Locally that is a temporary file in the same folder, fsync, rename, fsync of the
folder; on S3 an object only appears when its PUT (or its multipart upload) completes.
The checkpoint manager builds its commit protocol (manifest written last) on that.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, runtime_checkable

from pydantic import SecretStr

if TYPE_CHECKING:
    from gpuflow.blocks.checkpoint_storage import CheckpointStorage

_TEMP_MARK = ".tmp-"
_COPY_CHUNK_BYTES = 8 << 20


class StorageError(RuntimeError):
    """The checkpoint store refused or failed an operation."""


class ObjectNotFoundError(StorageError):
    """The key does not exist in the store."""


class BucketNotFoundError(StorageError):
    """The configured S3 bucket does not exist."""


class CredentialsRefusedError(StorageError):
    """The object store refused the credentials (unknown key, bad secret, no access)."""


@runtime_checkable
class CheckpointStore(Protocol):
    """Atomic blob storage under string keys ('/'-separated, relative)."""

    def put_bytes(self, key: str, data: bytes | bytearray | memoryview) -> None: ...

    def put_file(self, key: str, src: Path) -> None: ...

    def open_write(self, key: str) -> contextlib.AbstractContextManager[BinaryIO]:
        """A binary writer; the object appears (atomically) only when the block exits cleanly."""
        ...

    def get_bytes(self, key: str) -> bytes: ...

    def get_file(self, key: str, dest: Path) -> None: ...

    def list(self, prefix: str = "") -> list[str]:
        """Keys starting with ``prefix`` (a plain string prefix, as S3 does), sorted."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key``; removing a missing key is not an error (as on S3)."""
        ...

    def exists(self, key: str) -> bool: ...


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"storage key must be a non-empty string, got {key!r}")
    parts = key.split("/")  # not PurePosixPath: it would quietly fold "a//b" and "./a"
    if "\\" in key or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"storage key {key!r} must be a relative '/'-separated path without '..'")
    if any(_TEMP_MARK in p for p in parts):
        raise ValueError(f"storage key {key!r} may not contain {_TEMP_MARK!r} (reserved)")
    return key


def _fsync_dir(path: Path) -> None:
    # A rename or a new entry is only durable once the folder itself is synced.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        written = os.write(fd, data[: 64 << 20])
        data = data[written:]


class LocalStorage:
    """A folder on a local or network file system; atomic, durable writes."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).expanduser().resolve()
        if self.root.exists() and not self.root.is_dir():
            raise StorageError(f"checkpoint root {self.root} exists and is not a folder")
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalStorage(root={str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*PurePosixPath(_check_key(key)).parts)

    def _make_parent(self, path: Path) -> None:
        parent = path.parent
        missing: list[Path] = []
        probe = parent
        while not probe.exists():
            missing.append(probe)
            probe = probe.parent
        parent.mkdir(parents=True, exist_ok=True)
        # Sync each new folder's parent, top-down, so the new entries survive a crash.
        for created in reversed(missing):
            _fsync_dir(created.parent)

    @contextlib.contextmanager
    def open_write(self, key: str) -> Iterator[BinaryIO]:
        path = self._path(key)
        self._make_parent(path)
        tmp = path.with_name(f".{path.name}{_TEMP_MARK}{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb", buffering=0, closefd=True) as handle:
                yield handle  # type: ignore[misc]
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)

    def put_bytes(self, key: str, data: bytes | bytearray | memoryview) -> None:
        with self.open_write(key) as handle:
            _write_all(handle.fileno(), memoryview(data).cast("B"))

    def put_file(self, key: str, src: Path) -> None:
        with open(src, "rb") as source, self.open_write(key) as handle:
            shutil.copyfileobj(source, handle, _COPY_CHUNK_BYTES)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(f"no object {key!r} under {self.root}") from None

    def get_file(self, key: str, dest: Path) -> None:
        try:
            source = open(self._path(key), "rb")  # noqa: SIM115 - closed below
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(f"no object {key!r} under {self.root}") from None
        with source, open(dest, "wb") as target:
            shutil.copyfileobj(source, target, _COPY_CHUNK_BYTES)

    def list(self, prefix: str = "") -> list[str]:
        keys: list[str] = []
        # Walk only the folder the prefix names, not the whole root.
        head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self.root.joinpath(*PurePosixPath(head).parts) if head else self.root
        if not start.is_dir():
            return []
        for dirpath, _dirs, files in os.walk(start):
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            for name in files:
                if _TEMP_MARK in name:
                    continue  # an unfinished (or crashed) write, not an object
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        # Drop folders left empty so that a deleted checkpoint leaves no trace.
        parent = path.parent
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()


class S3Storage:
    """An S3 bucket (AWS, MinIO, Ceph RGW, ... via ``endpoint_url``) under a key prefix.

    Large objects go up as multipart uploads (boto3 TransferConfig); the object only
    becomes visible when the upload completes, so writes are atomic.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region_name: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: SecretStr | str | None = None,
        multipart_threshold_mb: int = 64,
        multipart_chunk_mb: int = 16,
        verify: bool = True,
    ) -> None:
        if not bucket or not isinstance(bucket, str):
            raise ValueError("S3Storage needs a bucket name")
        from gpuflow.blocks.checkpoint_storage import S3_MIN_PART_MB

        if multipart_threshold_mb < S3_MIN_PART_MB or multipart_chunk_mb < S3_MIN_PART_MB:
            raise ValueError(
                f"multipart_threshold_mb ({multipart_threshold_mb}) and multipart_chunk_mb "
                f"({multipart_chunk_mb}) must be at least {S3_MIN_PART_MB} (S3's minimum part size)"
            )
        if (access_key_id is None) != (secret_access_key is None):
            raise ValueError("give both access_key_id and secret_access_key, or neither")
        if isinstance(secret_access_key, str):
            secret_access_key = SecretStr(secret_access_key)

        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.endpoint_url = endpoint_url
        self.region_name = region_name
        self.access_key_id = access_key_id
        self._secret = secret_access_key
        self.multipart_threshold_mb = multipart_threshold_mb
        self.multipart_chunk_mb = multipart_chunk_mb
        self._connect()
        if verify:
            self.check()

    def _connect(self) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self._transfer = TransferConfig(
            multipart_threshold=self.multipart_threshold_mb << 20,
            multipart_chunksize=self.multipart_chunk_mb << 20,
        )
        config = Config(
            retries={"max_attempts": 5, "mode": "standard"},
            # Path-style addressing works on every S3-compatible server; virtual hosts
            # need DNS that custom endpoints rarely have.
            s3={"addressing_style": "path"} if self.endpoint_url else {},
        )
        self._client = boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region_name,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self._secret.get_secret_value() if self._secret else None,
            config=config,
        )

    # Pickled to a gang's ranks (through the agent's spawn pipe, never a command line): the
    # settings travel, the secret as a SecretStr, and each process opens its own client
    # (boto3 clients cannot be pickled); checked already, so not again.
    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_client", "_transfer")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._connect()

    def __repr__(self) -> str:
        return (
            f"S3Storage(bucket={self.bucket!r}, prefix={self.prefix!r}, "
            f"endpoint_url={self.endpoint_url!r}, access_key_id={self.access_key_id!r})"
        )

    # -- errors -------------------------------------------------------------------------

    def _where(self) -> str:
        return f"s3://{self.bucket}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")

    def _refused(self, code: str) -> CredentialsRefusedError:
        who = (
            f"access key id {self.access_key_id!r}" if self.access_key_id else "default credentials"
        )
        return CredentialsRefusedError(
            f"{self._where()} refused the credentials ({who}): {code}. "
            "Check the access key id and secret access key, and that they may use this bucket."
        )

    def _translate(self, exc: Exception, key: str | None = None) -> Exception:
        from botocore.exceptions import (
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
        )

        if isinstance(exc, NoCredentialsError):
            return CredentialsRefusedError(
                f"no S3 credentials for {self._where()}: set access_key_id/secret_access_key "
                "or the AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY environment"
            )
        if isinstance(exc, EndpointConnectionError):
            return StorageError(f"cannot reach the S3 endpoint for {self._where()}: {exc}")
        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchBucket",):
                return BucketNotFoundError(
                    f"S3 bucket {self.bucket!r} does not exist ({self._where()})"
                )
            if code in ("NoSuchKey", "404", "NotFound") and key is not None:
                return ObjectNotFoundError(f"no object {key!r} in {self._where()}/{self.prefix}")
            if code in (
                "InvalidAccessKeyId",
                "SignatureDoesNotMatch",
                "AccessDenied",
                "InvalidToken",
                "ExpiredToken",
                "403",
            ):
                return self._refused(code)
            return StorageError(f"S3 error on {self._where()} ({code or 'unknown'}): {exc}")
        return exc

    def check(self) -> None:
        """Verify that the bucket exists and the credentials are accepted; raise otherwise."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchBucket", "NotFound"):
                raise BucketNotFoundError(
                    f"S3 bucket {self.bucket!r} does not exist ({self._where()})"
                ) from None
            if code != "403":
                raise self._translate(exc) from None
        except BotoCoreError as exc:
            raise self._translate(exc) from None
        # HEAD answers carry no body, so a 403 does not say why; a listing does
        # (InvalidAccessKeyId, SignatureDoesNotMatch or AccessDenied).
        try:
            self._client.list_objects_v2(Bucket=self.bucket, MaxKeys=1)
        except (ClientError, BotoCoreError) as exc:
            raise self._translate(exc) from None
        raise self._refused("403 on HeadBucket")

    # -- operations ---------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return self.prefix + _check_key(key)

    def _upload(self, fileobj: BinaryIO, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.upload_fileobj(fileobj, self.bucket, self._key(key), Config=self._transfer)
        except (ClientError, BotoCoreError) as exc:
            raise self._translate(exc, key) from None
        except Exception as exc:  # s3transfer wraps ClientError in S3UploadFailedError
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, ClientError | BotoCoreError):
                raise self._translate(cause, key) from None
            raise

    @contextlib.contextmanager
    def open_write(self, key: str) -> Iterator[BinaryIO]:
        self._key(key)  # validate before any bytes are produced
        # Small objects stay in memory; large ones spill to a local temp file, from which
        # the multipart upload reads its parts (memory stays bounded for big models).
        with tempfile.SpooledTemporaryFile(max_size=self.multipart_threshold_mb << 20) as spool:
            yield spool  # type: ignore[misc]
            spool.seek(0)
            self._upload(spool, key)  # type: ignore[arg-type]

    def put_bytes(self, key: str, data: bytes | bytearray | memoryview) -> None:
        self._upload(_MemoryReader(memoryview(data).cast("B")), key)  # type: ignore[arg-type]

    def put_file(self, key: str, src: Path) -> None:
        with open(src, "rb") as handle:
            self._upload(handle, key)

    def _download(self, key: str, target: BinaryIO) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.download_fileobj(
                self.bucket, self._key(key), target, Config=self._transfer
            )
        except (ClientError, BotoCoreError) as exc:
            raise self._translate(exc, key) from None

    def get_bytes(self, key: str) -> bytes:
        buffer = io.BytesIO()
        self._download(key, buffer)
        return buffer.getvalue()

    def get_file(self, key: str, dest: Path) -> None:
        with open(dest, "wb") as handle:
            self._download(key, handle)

    def list(self, prefix: str = "") -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        keys: list[str] = []
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                keys.extend(item["Key"][len(self.prefix) :] for item in page.get("Contents", []))
        except (ClientError, BotoCoreError) as exc:
            raise self._translate(exc) from None
        return sorted(keys)

    def delete(self, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (ClientError, BotoCoreError) as exc:
            raise self._translate(exc, key) from None

    def exists(self, key: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")) in (
                "404",
                "NoSuchKey",
                "NotFound",
            ):
                return False
            raise self._translate(exc, key) from None
        except BotoCoreError as exc:
            raise self._translate(exc, key) from None
        return True


class _MemoryReader(io.RawIOBase):
    """A seekable reader over a memoryview, so uploads need no copy of the whole payload."""

    def __init__(self, data: memoryview) -> None:
        self._data = data
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._data)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        chunk = self._data[self._pos : self._pos + len(buffer)]
        size = len(chunk)
        memoryview(buffer).cast("B")[:size] = chunk
        self._pos += size
        return size

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size is None or size < 0 else self._pos + size
        chunk = bytes(self._data[self._pos : end])
        self._pos += len(chunk)
        return chunk


def open_store(config: CheckpointStorage, verify: bool = True) -> CheckpointStore:
    """The store a CheckpointStorage block configures; for S3, ``verify`` checks the bucket
    and the credentials now, before any job relies on them."""
    if config.kind == "local":
        return LocalStorage(config.local_root())
    return S3Storage(
        bucket=config.bucket,
        prefix=config.prefix,
        endpoint_url=config.endpoint_url or None,
        region_name=config.region_name or None,
        access_key_id=config.access_key_id or None,
        secret_access_key=config.secret_access_key if config.access_key_id else None,
        multipart_threshold_mb=config.multipart_threshold_mb,
        multipart_chunk_mb=config.multipart_chunk_mb,
        verify=verify,
    )
