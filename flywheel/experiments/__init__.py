"""The experiments' wing (floor 2 of flywheel/): `evaluation` (every evaluation of a policy goes through it, and
the episodes the experiments record), the ablation arms (`flywheel experiment`), the curriculum and SOP vs live
success. Imports only admin below it."""
