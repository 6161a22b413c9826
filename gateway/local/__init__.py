"""`pagedkube up`: the local stack (engine processes + the gateway in one supervisor)."""
