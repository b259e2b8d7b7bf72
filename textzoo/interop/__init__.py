"""Bridges to other tooling. Each submodule needs its own extra (`pip install textzoo[tianshou]`)."""
