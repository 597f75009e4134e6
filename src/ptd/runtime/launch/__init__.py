"""Starting a run: checks before anything starts, the launcher, several nodes."""
