"""The registrations users write today, measured against opreg in the same run."""
