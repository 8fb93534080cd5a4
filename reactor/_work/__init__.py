"""What a write does: writes, timers, jobs, the sweeper's chores."""
