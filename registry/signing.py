"""ed25519 signatures over model manifests: the learner signs, clients verify before loading.

The signature covers what makes a model that model (version, parent, stage, artifact address and
digest, training lineage), not the rollout channel: promoting a canary to stable republishes the
same signed manifest on another channel without needing the learner's key.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from registry.store import ModelRejected
from schemas import ModelVersionEvent

SCHEME = "ed25519"


def signed_bytes(event: ModelVersionEvent) -> bytes:
    """Canonical bytes of the signed fields (sorted-key JSON)."""
    fields = {
        "version": event.version,
        "parent": event.parent,
        "stage": event.stage,
        "artifact_uri": event.artifact_uri,
        "sha256": event.sha256,
        "lineage": event.lineage,
    }
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def load_or_create_key(keys_dir: Path) -> Ed25519PrivateKey:
    """The learner's signing key (created on first use, mode 0600); its public half is also written
    to `keys_dir/trusted/<key id>.pub`, which clients on this machine trust."""
    path = keys_dir / "learner.key"
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    else:
        keys_dir.mkdir(parents=True, exist_ok=True)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
    trust(key.public_key(), keys_dir / "trusted")
    return key


def trust(public_key: Ed25519PublicKey, trusted_dir: Path) -> Path:
    trusted_dir.mkdir(parents=True, exist_ok=True)
    path = trusted_dir / f"{key_id(public_key)}.pub"
    path.write_bytes(
        public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return path


def sign(event: ModelVersionEvent, key: Ed25519PrivateKey) -> str:
    """The `signature` field value: 'ed25519:<key id>:<base64 signature>'."""
    signature = base64.b64encode(key.sign(signed_bytes(event))).decode()
    return f"{SCHEME}:{key_id(key.public_key())}:{signature}"


class TrustedKeys:
    """Public keys a client accepts, read from a directory of PEM files named <key id>.pub."""

    def __init__(self, trusted_dir: Path):
        self.keys: dict[str, Ed25519PublicKey] = {}
        for path in sorted(Path(trusted_dir).glob("*.pub")):
            try:
                public_key = serialization.load_pem_public_key(path.read_bytes())
            except ValueError:
                continue  # not a PEM public key: trusts nothing, breaks nothing
            if isinstance(public_key, Ed25519PublicKey):
                self.keys[key_id(public_key)] = public_key

    def verify(self, event: ModelVersionEvent) -> None:
        """Return if the manifest is signed by a trusted key; ModelRejected saying why otherwise."""
        if not event.signature:
            raise ModelRejected(f"model {event.version} is unsigned")
        scheme, _, rest = event.signature.partition(":")
        signer, _, encoded = rest.partition(":")
        if scheme != SCHEME or not encoded:
            raise ModelRejected(f"model {event.version}: malformed signature field")
        if signer not in self.keys:
            raise ModelRejected(f"model {event.version} is signed by unknown key {signer}", permanent=False)
        try:
            self.keys[signer].verify(base64.b64decode(encoded), signed_bytes(event))
        except (InvalidSignature, ValueError) as error:
            raise ModelRejected(f"model {event.version}: bad signature by key {signer}") from error
