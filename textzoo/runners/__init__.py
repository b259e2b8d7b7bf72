"""Runners: the trainer and what it drives (rollouts, updates, engines, checkpoints, run folders, logging), the
command line (`textzoo train|eval|plot|sft|bench`) and data-parallel launching. Nothing imports runners."""
