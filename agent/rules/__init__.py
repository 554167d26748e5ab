"""Health rules: judge raw samples into faults (one rule per module) and keep their lifetimes (engine)."""
