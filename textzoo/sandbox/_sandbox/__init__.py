"""The inside of the sandbox: what runs in the zygote and its children.

Standard library only and no `textzoo` imports: the zygote runs these modules under `python -I -S`,
importing them as the top-level package `_sandbox`; the parent imports them as
`textzoo.sandbox._sandbox` for the protocol's constants. `textzoo.sandbox` is the public API.
"""
