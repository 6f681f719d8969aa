"""How the learner trains: one resumable run (training_run), SFT, offline RL, online RL, semi-online RL, their losses
and log-probabilities, data parallelism, and the one dispatcher of the curriculum's stages (stages).
"""
