"""The running system's wing (floor 3 of flywheel/): a local stack (broker, topics, faust worker), fleets of edge
clients in it, the release (demonstrations through the pipeline, SFT, the committed bundle) and the demo, turn
by turn or continuous. Imports admin and experiments below it."""
