"""What the experiments' rounds gather from the environment: episodes as the pipeline's rows, and the
supervision the fleet's experience buys (search successes, teacher continuations, DART's noisy demonstrations)."""
