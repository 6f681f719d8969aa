"""What the experiments gather from the environment: episodes as the pipeline's rows, the supervision the
fleet's experience buys (search successes, teacher continuations, DART's noisy demonstrations), and every
evaluation of a policy (greedy success on held-out seeds)."""
