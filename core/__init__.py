"""What every floor shares: typed settings, the object-store location, child processes, metrics endpoints,
statistics, console output and config-derived CLI flags."""
