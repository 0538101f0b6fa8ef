"""Dashboards, alert rules and offline reports of a prefixfleet fleet's Prometheus metrics."""
