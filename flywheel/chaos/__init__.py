"""`flywheel chaos`: the continuous flywheel under a seeded schedule of faults, and the ledger check after it."""
