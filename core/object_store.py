"""The flywheel's data directory on local disk or an S3-compatible object store: where a location lives, the options
delta-rs and polars need to reach it, and `Files` for what they do not do for us (the model store's objects, the
manifests, the pins, a Delta log's checkpoint pointer, the conditional-put probe).

`Files` goes through obstore, the Python binding of the Rust `object_store` crate that delta-rs itself uses: one
library signs the requests (AWS Signature V4), retries, and does the conditional create (`If-None-Match: *` on S3,
a hard link on a local disk), for the tables and for the files around them alike.

A location is a local path or an `s3://bucket/prefix` URI (`is_remote`); `join` appends to either. Path-style
addressing on the configured endpoint (S3Proxy, MinIO, ... and AWS itself).
"""

from __future__ import annotations

import datetime as dt
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import obstore
from obstore.exceptions import AlreadyExistsError, BaseError, NotFoundError, PreconditionError
from obstore.store import LocalStore, S3Store

Location = Path | str  # a local directory, or an s3://bucket/prefix URI


class ObjectStoreError(RuntimeError):
    """A request the object store refused or could not answer; the message names the request and the answer."""


class TooLarge(ObjectStoreError):
    """A file over the bound its reader set: refused before it is read whole."""


class PreconditionFailed(ObjectStoreError):
    """A conditional write found the key taken (HTTP 412, or the name taken on a local disk): another writer got
    there first."""


def is_remote(location: Location) -> bool:
    return str(location).startswith("s3://")


def join(location: Location, *parts: str) -> Location:
    """`location/part/...`: a Path for a local location, an s3:// URI string for a remote one."""
    if is_remote(location):
        return "/".join([str(location).rstrip("/"), *(p.strip("/") for p in parts)])
    return Path(location).joinpath(*parts)


def split_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/some/key -> ("bucket", "some/key")."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"not an s3://bucket/key URI: {uri!r}")
    return parsed.netloc, parsed.path.lstrip("/")


@dataclass(frozen=True)
class S3Config:
    """How to reach the store: endpoint (http://host:port), credentials, region."""

    endpoint: str
    access_key: str
    secret_key: str = field(repr=False)  # never in a log line or a traceback's repr
    region: str = "us-east-1"

    def delta_options(self) -> dict[str, str]:
        """delta-rs / polars storage options (object_store keys, lowercase). Commits are put-if-absent
        (If-None-Match: *, `aws_conditional_put=etag`): two writers can never both write version N."""
        return {
            "aws_endpoint_url": self.endpoint,
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
            "aws_region": self.region,
            "aws_allow_http": "true" if self.endpoint.startswith("http://") else "false",
            "aws_conditional_put": "etag",
            "aws_virtual_hosted_style_request": "false",
        }


# How long a request may take, and how a failed one is retried (5xx answers, connection errors and timeouts only):
# a store that is down fails a call within about a minute (the library's own default waits up to 3 minutes), so a
# caller (an edge fetching a model, a learner publishing) sees the outage and retries on its own schedule.
CLIENT_OPTIONS = {"timeout": dt.timedelta(seconds=30), "connect_timeout": dt.timedelta(seconds=5)}
RETRY = {"max_retries": 3, "retry_timeout": dt.timedelta(seconds=20)}


def s3_store(config: S3Config, bucket: str) -> S3Store:
    """A store on `bucket`, path-style, its creates conditional (`conditional_put="etag"`: `If-None-Match: *`, as
    delta-rs commits), plain http allowed for an http:// endpoint (the loopback S3Proxy)."""
    return S3Store(
        bucket,
        endpoint=config.endpoint,
        access_key_id=config.access_key,
        secret_access_key=config.secret_key,
        region=config.region,
        virtual_hosted_style_request=False,
        conditional_put="etag",
        client_options={**CLIENT_OPTIONS, "allow_http": config.endpoint.startswith("http://")},
        retry_config=RETRY,
    )


def shared_store(config: S3Config, bucket: str) -> S3Store:
    """One store (its connection pool) per bucket and credential, for the whole process; safe across threads. A
    forked child makes its own: a pool's connections and its runtime's threads do not survive a fork."""
    return _store_of_process(config, bucket, os.getpid())


@functools.lru_cache(maxsize=16)
def _store_of_process(config: S3Config, bucket: str, pid: int) -> S3Store:
    return s3_store(config, bucket)


@functools.lru_cache(maxsize=1)
def local_store() -> LocalStore:
    """The local disk, rooted at /: a location's absolute path, less its leading slash, is its path in the store."""
    return LocalStore()


class Files:
    """One small file API over local paths and s3:// URIs, for the bookkeeping files around the tables (manifests,
    pins, a Delta log's checkpoint pointer): read, write (optionally only if absent), list, delete. obstore does each
    on either: a write is atomic (a reader never sees half: a staged file renamed, or one PUT), a write-if-absent is a
    hard link or a PUT with `If-None-Match: *`."""

    def __init__(self, config: Callable[[], S3Config]):
        self._config = config  # the credential is looked up at the first remote call only

    def _locate(self, location: Location) -> tuple[S3Store | LocalStore, str]:
        """(store, path in it) of `location`."""
        if is_remote(location):
            bucket, key = split_uri(str(location))
            return shared_store(self._config(), bucket), key
        return local_store(), os.path.abspath(location).lstrip("/")  # abspath: the store refuses "..", "//"

    def read(self, location: Location, max_bytes: int | None = None) -> bytes | None:
        """The file's bytes, None when there is none; TooLarge, before its body is read, for one over `max_bytes`."""
        store, path = self._locate(location)
        try:
            result = obstore.get(store, path)
            size = result.meta["size"]
            if max_bytes is not None and size > max_bytes:
                raise TooLarge(f"{location}: {size} bytes, over the bound of {max_bytes}")
            return bytes(result.bytes())
        except (FileNotFoundError, NotFoundError):
            return None
        except BaseError as error:
            raise ObjectStoreError(f"read {location}: {_brief(error)}") from error

    def write(self, location: Location, data: bytes, if_absent: bool = False) -> None:
        """Write atomically (a reader never sees half); with `if_absent`, PreconditionFailed when it exists."""
        store, path = self._locate(location)
        try:
            obstore.put(store, path, data, mode="create" if if_absent else "overwrite", use_multipart=False)
        except (AlreadyExistsError, PreconditionError):
            raise PreconditionFailed(f"{location} already exists") from None
        except BaseError as error:
            raise ObjectStoreError(f"write {location}: {_brief(error)}") from error

    def exists(self, location: Location) -> bool:
        store, path = self._locate(location)
        try:
            obstore.head(store, path)
        except (FileNotFoundError, NotFoundError):
            return False
        except BaseError as error:
            raise ObjectStoreError(f"exists {location}: {_brief(error)}") from error
        return True

    def list(self, location: Location) -> list[Location]:
        """Every file under the directory or prefix `location` (recursively), sorted: s3:// URIs for a remote
        location, Paths under `location` (as it was given, relative or absolute) for a local one."""
        store, prefix = self._locate(location)
        try:
            found = [meta["path"] for chunk in obstore.list(store, prefix=prefix or None) for meta in chunk]
        except BaseError as error:
            raise ObjectStoreError(f"list {location}: {_brief(error)}") from error
        if is_remote(location):
            bucket = split_uri(str(location))[0]
            return sorted(f"s3://{bucket}/{key}" for key in found)
        return sorted(Path(location) / key.removeprefix(prefix).lstrip("/") for key in found)

    def delete(self, location: Location) -> None:
        """Remove the file; nothing to do when there is none."""
        store, path = self._locate(location)
        try:
            obstore.delete(store, path)
        except (FileNotFoundError, NotFoundError):
            pass
        except BaseError as error:
            raise ObjectStoreError(f"delete {location}: {_brief(error)}") from error


def _brief(error: BaseError) -> str:
    """The library's message without the debug dump it appends (the chained exception keeps that)."""
    return str(error).split("\n\nDebug source:", 1)[0]
