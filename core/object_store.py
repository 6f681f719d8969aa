"""An S3-compatible object store as the flywheel's data directory: where a location lives, the options delta-rs and
polars need to reach it, and a small signed client (AWS Signature V4 over httpx) for what they do not do for us:
the model store's objects, the pins, and the conditional-put probe.

A location is a local path or an `s3://bucket/prefix` URI (`is_remote`); `join` appends to either. Path-style
addressing on the configured endpoint (S3Proxy, MinIO, ... and AWS itself).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import hmac
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlparse

Location = Path | str  # a local directory, or an s3://bucket/prefix URI


class ObjectStoreError(RuntimeError):
    """A request the object store refused or could not answer; the message names the request and the answer."""


class TooLarge(ObjectStoreError):
    """A file over the bound its reader set: refused before it is read whole."""


class PreconditionFailed(ObjectStoreError):
    """A conditional write found the key taken (HTTP 412): another writer got there first."""


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


class S3Client:
    """The few S3 calls the flywheel makes itself, signed with AWS Signature V4 (path-style)."""

    def __init__(self, config: S3Config, timeout: float = 30.0):
        import httpx

        self.config = config
        self._http = httpx.Client(base_url=config.endpoint, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def create_bucket(self, bucket: str) -> None:
        """Create `bucket` unless it exists (ours already: fine)."""
        response = self._request("PUT", bucket, "")
        if response.status_code not in (200, 409):
            raise ObjectStoreError(f"create bucket {bucket}: HTTP {response.status_code} {response.text[:300]}")

    def put(self, uri: str, body: bytes, if_absent: bool = False) -> None:
        """Write `body` at `uri`; with `if_absent`, only if no object is there (PreconditionFailed otherwise)."""
        bucket, key = split_uri(uri)
        headers = {"If-None-Match": "*"} if if_absent else {}
        response = self._request("PUT", bucket, key, body=body, headers=headers)
        if response.status_code == 412:
            raise PreconditionFailed(f"{uri} already exists")
        self._check(response, "PUT", uri)

    def get(self, uri: str, max_bytes: int | None = None) -> bytes | None:
        """The object's bytes, None when there is none; TooLarge, before more than `max_bytes` are read, for a
        larger one."""
        bucket, key = split_uri(uri)
        with self._request("GET", bucket, key, stream=True) as response:
            if response.status_code == 404:
                return None
            if response.status_code >= 300:
                response.read()
                self._check(response, "GET", uri)
            declared = int(response.headers.get("content-length", 0))
            if max_bytes is not None and declared > max_bytes:
                raise TooLarge(f"GET {uri}: {declared} bytes, over the bound of {max_bytes}")
            data = bytearray()
            for chunk in response.iter_bytes():
                data += chunk
                if max_bytes is not None and len(data) > max_bytes:
                    raise TooLarge(f"GET {uri}: over the bound of {max_bytes} bytes")
            return bytes(data)

    def exists(self, uri: str) -> bool:
        bucket, key = split_uri(uri)
        response = self._request("HEAD", bucket, key)
        if response.status_code == 404:
            return False
        self._check(response, "HEAD", uri)
        return True

    def delete(self, uri: str) -> None:
        bucket, key = split_uri(uri)
        response = self._request("DELETE", bucket, key)
        if response.status_code != 404:
            self._check(response, "DELETE", uri)

    def list(self, prefix_uri: str) -> list[str]:
        """URIs of every object under `prefix_uri/` (ListObjectsV2, every page)."""
        from xml.etree import ElementTree

        bucket, prefix = split_uri(prefix_uri.rstrip("/") + "/")
        found, token = [], None
        while True:
            query = {"list-type": "2", "prefix": prefix} | ({"continuation-token": token} if token else {})
            response = self._request("GET", bucket, "", query=query)
            self._check(response, "LIST", prefix_uri)
            root = ElementTree.fromstring(response.content)
            ns = root.tag.partition("}")[0] + "}" if root.tag.startswith("{") else ""
            found += [f"s3://{bucket}/{k.text}" for k in root.iter(f"{ns}Key")]
            truncated = root.findtext(f"{ns}IsTruncated") == "true"
            token = root.findtext(f"{ns}NextContinuationToken")
            if not truncated or not token:
                return found

    def _check(self, response, method: str, uri: str) -> None:
        if response.status_code >= 300:
            raise ObjectStoreError(f"{method} {uri}: HTTP {response.status_code} {response.text[:300]}")

    def _request(self, method: str, bucket: str, key: str, body: bytes = b"", headers: dict | None = None,
                 query: dict | None = None, stream: bool = False):  # fmt: skip
        """The response; with `stream`, a context manager over it whose body is read as it arrives."""
        path = "/" + quote(bucket) + ("/" + quote(key, safe="/~") if key else "")
        signed = sign_v4(self.config, method, self._http.base_url.netloc.decode(), path, query or {}, body)
        request = self._http.build_request(method, path, params=query, content=body,
                                           headers={**(headers or {}), **signed})  # fmt: skip
        if stream:
            return contextlib.closing(self._http.send(request, stream=True))
        return self._http.send(request)


@functools.lru_cache(maxsize=8)
def shared_client(config: S3Config) -> S3Client:
    """One client (its connection pool) per store and credential, for the whole process."""
    return S3Client(config)


def sign_v4(config: S3Config, method: str, host: str, path: str, query: dict[str, str], body: bytes,
            now: dt.datetime | None = None) -> dict[str, str]:  # fmt: skip
    """The headers that sign a request with AWS Signature Version 4 (service s3): x-amz-date,
    x-amz-content-sha256 and Authorization. `path` is already URI-encoded."""
    now = now or dt.datetime.now(dt.UTC)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload_hash = hashlib.sha256(body).hexdigest()
    canonical_query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items()))
    headers = {"host": host, "x-amz-content-sha256": payload_hash, "x-amz-date": amz_date}
    signed_headers = ";".join(sorted(headers))
    canonical_headers = "".join(f"{name}:{headers[name]}\n" for name in sorted(headers))
    canonical_request = "\n".join([method, path, canonical_query, canonical_headers, signed_headers, payload_hash])
    scope = f"{day}/{config.region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical_request.encode()).hexdigest()])
    key = f"AWS4{config.secret_key}".encode()
    for part in (day, config.region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    authorization = (f"AWS4-HMAC-SHA256 Credential={config.access_key}/{scope}, "
                     f"SignedHeaders={signed_headers}, Signature={signature}")  # fmt: skip
    return {"x-amz-date": amz_date, "x-amz-content-sha256": payload_hash, "Authorization": authorization}


class Files:
    """One small file API over local paths and s3:// URIs, for the bookkeeping files around the tables (manifests,
    pins, a Delta log's checkpoint pointer): read, write (optionally only if absent), list, delete."""

    def __init__(self, config: Callable[[], S3Config]):
        self._config = config  # the credential is looked up at the first remote call only

    def _s3(self) -> S3Client:
        return shared_client(self._config())

    def read(self, location: Location, max_bytes: int | None = None) -> bytes | None:
        """The file's bytes, None when there is none; TooLarge for one over `max_bytes`."""
        if is_remote(location):
            return self._s3().get(str(location), max_bytes)
        try:
            with open(location, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if max_bytes is not None and size > max_bytes:
                    raise TooLarge(f"{location}: {size} bytes, over the bound of {max_bytes}")
                return handle.read()
        except FileNotFoundError:
            return None

    def write(self, location: Location, data: bytes, if_absent: bool = False) -> None:
        """Write atomically (a reader never sees half); with `if_absent`, PreconditionFailed when it exists."""
        if is_remote(location):
            self._s3().put(str(location), data, if_absent=if_absent)
            return
        path = Path(location)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # one per writer thread
        tmp.write_bytes(data)
        if if_absent:
            try:
                os.link(tmp, path)  # fails when the name is taken: put-if-absent on a local disk
            except FileExistsError:
                raise PreconditionFailed(f"{path} already exists") from None
            finally:
                tmp.unlink()
        else:
            tmp.replace(path)

    def exists(self, location: Location) -> bool:
        return self._s3().exists(str(location)) if is_remote(location) else Path(location).exists()

    def list(self, location: Location) -> list[Location]:
        """Every file under the directory or prefix `location` (recursively), sorted."""
        if is_remote(location):
            return sorted(self._s3().list(str(location)))
        root = Path(location)
        return sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []

    def delete(self, location: Location) -> None:
        if is_remote(location):
            self._s3().delete(str(location))
        else:
            Path(location).unlink(missing_ok=True)
