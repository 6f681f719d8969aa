"""Edge client: runs a policy in MiniWoB++ and publishes every think -> act -> verify step to Kafka."""
