"""The experiment's arms, one module each: a recipe of what the arm trains on and how, over the harness's shared parts
(flywheel.experiments.harness: the start, the demonstrations, the exploration, the twins, the evaluation).

Each module defines NAME, SUMMARY, AFTER (the arm whose model it starts from, "" for the start), SETTINGS (the
dataclass of its own settings, a node of the harness's config, or None) and `train(ctx, settings) -> Trained`
(ctx: the harness's ArmContext). A module imports nothing of flywheel/: what it needs of the harness comes through ctx.
"""
