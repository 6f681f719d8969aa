"""Kafka: clients configured one way, topics defined once and administered on any cluster, the local broker."""
