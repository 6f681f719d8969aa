"""The benchmarks' wing (floor 4 of flywheel/): the pipeline (faust vs a bare consumer), the VLA step at the edge,
the environment, the learner's updates and table maintenance, each printing its figures beside its baseline."""
