"""Kafka topics, the local broker, and the faust app."""
