"""What to make: job specs and generation settings (`specs`), job files (`files`)."""
