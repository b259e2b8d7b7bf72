"""The actor-critic family: IAC, MAAC, IPPO, MAPPO."""
