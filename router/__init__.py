"""Data plane: prefix index, routing policies, sidecar and gateway."""
