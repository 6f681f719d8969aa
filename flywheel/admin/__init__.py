"""The operator's commands (floor 1 of flywheel/): Prometheus for a run and its queries, `flywheel status`, the
canary controller, the dead letters, replaying the log into tables, replaying an edge client's spool, table
maintenance. Imports no other wing."""
