"""Health: the monitor (heartbeats, restarts) and the data-balance check."""
