"""The learner: reads the Delta tables with polars, trains the VLA through the curriculum (SFT, teacher-label
retrains, offline / online / semi-online RL), exports it to ONNX and publishes each version signed."""
