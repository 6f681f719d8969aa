"""Content-addressed model store: artifacts live at `<artifacts_dir>/sha256/<digest><suffix>` (`.vla` for a
bundle), with a JSON manifest per version. Torch-free: edge clients use it to verify what they load."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from urllib.parse import urlparse

import msgspec

from schemas import ModelVersionEvent


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


def store_artifact(src: Path, artifacts_dir: Path) -> tuple[str, str]:
    """Copy `src` into the store under its own digest; return (uri, sha256)."""
    digest = sha256_of(src)
    target = artifacts_dir.resolve() / "sha256" / f"{digest}{src.suffix}"
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        tmp = target.with_suffix(".tmp")
        shutil.copyfile(src, tmp)
        tmp.replace(target)  # atomic: a reader never sees half a model
    return target.as_uri(), digest


def write_manifest(event: ModelVersionEvent, artifacts_dir: Path, extra: dict | None = None) -> Path:
    path = artifacts_dir / "manifests" / f"{event.version}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    manifest = {**msgspec.structs.asdict(event), **(extra or {})}  # the event as published, plus training details
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return path


def read_manifests(artifacts_dir: Path) -> list[dict]:
    """Every version's manifest in the store, oldest first (by produced_at)."""
    found = [json.loads(path.read_text()) for path in (artifacts_dir / "manifests").glob("*.json")]
    return sorted(found, key=lambda manifest: manifest["produced_at"])


def fetch_verified(uri: str, sha256: str) -> Path:
    """Local path of the artifact at `uri` after checking its digest; ModelRejected otherwise."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("file", ""):
        raise ModelRejected(f"unsupported artifact scheme {parsed.scheme!r} in {uri}")
    path = Path(parsed.path)
    if not path.is_file():
        raise ModelRejected(f"artifact {uri} does not exist", permanent=False)
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
    manifests = artifacts_dir / "manifests"
    if path_or_version == "latest":
        found = read_manifests(artifacts_dir)
        if not found:
            raise FileNotFoundError(f"no model versions under {manifests}")
        manifest = found[-1]
    else:
        manifest_path = manifests / f"{path_or_version}.json"
        if not manifest_path.is_file():
            raise FileNotFoundError(f"{path_or_version!r} is neither a model file nor a version in {manifests}")
        manifest = json.loads(manifest_path.read_text())
    return fetch_verified(manifest["artifact_uri"], manifest["sha256"]), manifest["version"]
