"""Content-addressed model store: artifacts live at `<artifacts_dir>/sha256/<digest><suffix>` (`.vla` for a
bundle), with a JSON manifest per version. Torch-free: edge clients use it to verify what they load.

`artifacts_dir` is a local directory or an s3:// prefix (settings.data_dir on the object store): an artifact there
is put only if absent (the digest names it: a second writer has the same bytes), and fetched into a local cache
(`<home>/models/sha256/`) before its digest is checked."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from urllib.parse import urlparse

import msgspec

from core.object_store import Location, ObjectStoreError, PreconditionFailed, TooLarge, is_remote, join
from core.settings import get_settings
from schemas import ModelVersionEvent

log = logging.getLogger(__name__)


class ModelRejected(Exception):
    """An artifact that must not be loaded; the message says why. `permanent`: the manifest itself is
    bad (checksum, signature) and will never load; otherwise (artifact not visible yet, signing key
    not yet trusted) a later attempt may succeed."""

    def __init__(self, message: str, permanent: bool = True):
        super().__init__(message)
        self.permanent = permanent


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def store_artifact(src: Path, artifacts_dir: Location) -> tuple[str, str]:
    """Copy `src` into the store under its own digest; return (uri, sha256)."""
    digest = sha256_of(src)
    if is_remote(artifacts_dir):
        target = str(join(artifacts_dir, "sha256", f"{digest}{src.suffix}"))
        with contextlib.suppress(PreconditionFailed):  # already there: the same bytes, by their digest
            get_settings().files().write(target, src.read_bytes(), if_absent=True)
        return target, digest
    target = Path(artifacts_dir).resolve() / "sha256" / f"{digest}{src.suffix}"
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        tmp = target.with_suffix(".tmp")
        shutil.copyfile(src, tmp)
        tmp.replace(target)  # atomic: a reader never sees half a model
    return target.as_uri(), digest


MANIFESTS, RETIRED = "manifests", "retired"  # a live version's manifest; a retired one's (its artifact deleted)


def manifest_location(artifacts_dir: Location, version: str, folder: str = MANIFESTS) -> Location:
    return join(artifacts_dir, folder, f"{version}.json")


def write_manifest(event: ModelVersionEvent, artifacts_dir: Location, extra: dict | None = None) -> Location:
    path = manifest_location(artifacts_dir, event.version)
    manifest = {**msgspec.structs.asdict(event), **(extra or {})}  # the event as published, plus training details
    get_settings().files().write(path, json.dumps(manifest, indent=2, sort_keys=True).encode())
    return path


# What a manifest's readers rely on, with its type: version and time always; the rest where present (maintenance
# reads only lineage, a client the artifact's address and digest: resolve_model requires those).
MANIFEST_FIELDS = {"version": str, "produced_at": (int, float), "artifact_uri": str, "sha256": str, "lineage": dict}
REQUIRED_FIELDS = ("version", "produced_at")
MAX_MANIFEST_BYTES = 1024 * 1024


def read_manifest(artifacts_dir: Location, version: str, folder: str = MANIFESTS) -> dict | None:
    """One version's manifest, None when the store has none by that name; ValueError naming the file for one that
    is not a manifest (truncated, altered, oversized)."""
    location = manifest_location(artifacts_dir, version, folder)
    try:
        data = get_settings().files().read(location, max_bytes=MAX_MANIFEST_BYTES)
    except TooLarge as error:
        raise ValueError(f"manifest {location}: {error}") from error
    return None if data is None else parse_manifest(data, location)


def parse_manifest(data: bytes, location: Location) -> dict:
    try:
        manifest = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"manifest {location} is not JSON: {error}") from error
    if not isinstance(manifest, dict):
        raise ValueError(f"manifest {location} is not a JSON object")
    problems = [f"lacks {name}" for name in REQUIRED_FIELDS if name not in manifest]
    problems += [f"{name} is not a {getattr(kind, '__name__', 'number')}" for name, kind in MANIFEST_FIELDS.items()
                 if name in manifest and not isinstance(manifest[name], kind)]  # fmt: skip
    if problems:
        raise ValueError(f"manifest {location}: {', '.join(problems)}")
    return manifest


def read_manifests(artifacts_dir: Location, skip_unreadable: bool = True, folder: str = MANIFESTS) -> list[dict]:
    """Every version's manifest in the store (or, with `folder=RETIRED`, every retired one's), oldest first (by
    produced_at). An unreadable one is logged and skipped, so one bad file hides one version, not the store;
    `skip_unreadable=False` raises instead, for a caller that must not act on a partial view (maintenance deleting
    what a version's lineage pins)."""
    found = []
    for location in manifest_locations(artifacts_dir, folder):
        try:
            found.append(read_manifest(artifacts_dir, Path(str(location)).stem, folder))
        except ValueError as error:
            if not skip_unreadable:
                raise
            log.error("skipping %s", error)
    return sorted((m for m in found if m), key=lambda manifest: float(manifest["produced_at"]))


def ancestry(artifacts_dir: Location, version: str) -> list[dict]:
    """The manifests of `version` and of the versions it descends from, newest first, back to its first SFT (or the
    first version without a parent): each manifest's `parent` is the version published before it. A retired
    version's manifest is read from RETIRED: who descends from whom outlives the artifacts."""
    chain: list[dict] = []
    while version and not (chain and chain[-1].get("stage") == "sft"):
        manifest = read_manifest(artifacts_dir, version) or read_manifest(artifacts_dir, version, RETIRED)
        if manifest is None:
            raise FileNotFoundError(f"no manifest of {version!r} under {join(artifacts_dir, MANIFESTS)}")
        if any(m["version"] == version for m in chain):  # an altered manifest must not loop the walk forever
            raise ValueError(f"manifest {version!r} descends from itself")
        chain.append(manifest)
        version = manifest.get("parent", "")
    return chain


def manifest_locations(artifacts_dir: Location, folder: str = MANIFESTS) -> list[Location]:
    return [p for p in get_settings().files().list(join(artifacts_dir, folder)) if str(p).endswith(".json")]


def versions_to_retire(manifests: list[dict], keep_last: int, needed: set[str]) -> list[dict]:
    """The manifests (oldest first, as read_manifests gives them) of every version but the newest `keep_last` and
    the `needed` ones."""
    keep = {m["version"] for m in manifests[max(0, len(manifests) - keep_last) :]} | needed
    return [m for m in manifests if m["version"] not in keep]


def retire(artifacts_dir: Location, manifest: dict, named_by_live: set[str]) -> None:
    """Retire one version: its manifest moves to RETIRED (written there first, so a crash leaves it in both, never
    in neither), then its artifact is deleted unless a live version names the same bytes (`named_by_live`: their
    digests)."""
    files = get_settings().files()
    version = manifest["version"]
    files.write(manifest_location(artifacts_dir, version, RETIRED), json.dumps(manifest, indent=2).encode())
    files.delete(manifest_location(artifacts_dir, version))
    if "artifact_uri" in manifest and manifest.get("sha256") not in named_by_live:
        files.delete(artifact_location(manifest["artifact_uri"]))


def artifact_location(uri: str) -> Location:
    """Where the artifact a manifest names lies, as Files and the object store take it: an s3:// URI as it is, a
    file:// URI (or a bare path) as a local path; ModelRejected for any other scheme."""
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        return uri
    if parsed.scheme in ("file", ""):
        return Path(parsed.path)
    raise ModelRejected(f"unsupported artifact scheme {parsed.scheme!r} in {uri}")


def fetch_verified(uri: str, sha256: str) -> Path:
    """Local path of the artifact at `uri` after checking its digest; ModelRejected otherwise. An s3:// artifact
    is downloaded into the local cache first (kept: its name is its digest)."""
    location = artifact_location(uri)
    path = location if isinstance(location, Path) else _cached(uri, sha256)
    if not path.is_file():
        raise ModelRejected(f"artifact {uri} does not exist", permanent=False)
    if path.stat().st_size > get_settings().max_model_bytes:
        raise ModelRejected(f"artifact {uri}: {path.stat().st_size} bytes, over settings.max_model_bytes")
    actual = sha256_of(path)
    if actual != sha256:
        raise ModelRejected(f"checksum mismatch for {uri}: expected {sha256[:12]}…, got {actual[:12]}…")
    return path


RELEASE_DIR = Path(__file__).resolve().parents[1] / "release"  # the committed release artifact


def resolve_model(path_or_version: str, artifacts_dir: Path) -> tuple[Path, str]:
    """(model path, version) for a file path, a version id, 'latest', or 'release' (RELEASE_DIR/manifest.json)."""
    candidate = Path(path_or_version)
    if candidate.is_file():
        return candidate, candidate.stem
    if path_or_version == "release":
        manifest = json.loads((RELEASE_DIR / "manifest.json").read_text())
        artifact = RELEASE_DIR / manifest["artifact"]
        return fetch_verified(artifact.as_uri(), manifest["sha256"]), manifest["version"]
    manifests = join(artifacts_dir, "manifests")
    if path_or_version == "latest":
        found = read_manifests(artifacts_dir)
        if not found:
            raise FileNotFoundError(f"no model versions under {manifests}")
        manifest = found[-1]
    else:
        manifest = read_manifest(artifacts_dir, path_or_version)
        if manifest is None:
            raise FileNotFoundError(f"{path_or_version!r} is neither a model file nor a version in {manifests}")
    if not {"artifact_uri", "sha256"} <= manifest.keys():
        raise ValueError(f"manifest of {manifest['version']} names no artifact (artifact_uri, sha256)")
    return fetch_verified(manifest["artifact_uri"], manifest["sha256"]), manifest["version"]


def _cached(uri: str, sha256: str) -> Path:
    """The object at `uri` in the local model cache, downloaded unless a file of that digest is there. Only bytes
    of that digest enter the cache: a tampered object is refused, and fetched again next time."""
    settings = get_settings()
    path = settings.home / "models" / "sha256" / f"{sha256}{Path(uri).suffix}"
    if path.is_file():
        return path
    try:
        data = settings.files().read(uri, max_bytes=settings.max_model_bytes)
    except TooLarge as error:
        raise ModelRejected(f"artifact {uri} refused: {error}") from error
    except ObjectStoreError as error:
        raise ModelRejected(f"artifact {uri} could not be fetched: {error}", permanent=False) from error
    if data is None:
        raise ModelRejected(f"artifact {uri} does not exist", permanent=False)
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise ModelRejected(f"checksum mismatch for {uri}: expected {sha256[:12]}…, got {actual[:12]}…")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)  # atomic: a reader never sees half a model
    return path
