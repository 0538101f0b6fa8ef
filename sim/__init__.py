"""Discrete-event fleet simulator running the production policy and autoscaler code."""
