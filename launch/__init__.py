"""Command-line entry points (absl flags live only here)."""
