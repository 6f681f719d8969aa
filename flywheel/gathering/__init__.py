"""What the experiments gather from the environment, and every evaluation: episodes as the pipeline's rows, the
supervision the fleet's experience buys (search successes, teacher continuations, DART's noisy demonstrations), and
`flywheel eval`'s one home: the engine that runs a policy in N browsers, greedy success on held-out seeds, pass@K,
paired comparisons (evaluation.py) and the command with SOP (eval_command.py)."""
