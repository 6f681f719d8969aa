"""Flywheel: an event-sourced streaming data flywheel that trains GUI agents."""
