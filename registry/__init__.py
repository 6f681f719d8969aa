"""The model registry: the content-addressed store of model versions, their ed25519 signatures, and the
rollout channels (stable, canary) clients follow."""
