"""Data sets used by the studies."""
