"""The learner as a service: the daemon's loop (loop) and settings (daemon_config), publishing a version (publish), one
SFT run (sft_once), the no-fleet twin (twin), its metrics.
"""
