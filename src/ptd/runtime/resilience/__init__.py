"""Surviving faults: collective timeouts, fault injection, restarts, Ctrl-C."""
