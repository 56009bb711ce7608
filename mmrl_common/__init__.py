"""What every mmrl package may import: user-facing errors, the registry class, cache paths.

Dependency-free (standard library only), so the leaf packages (``vision``, ``video``, ``rewards``,
``data_pipelines``) never import the engine (``mmrl``).
"""
