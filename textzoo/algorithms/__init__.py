"""The algorithm families, their registry and the shared math (one folder per family)."""
