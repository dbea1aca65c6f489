"""A stand-in for Mooncake's Python package, backed by Crescent.

Put python/compat on PYTHONPATH (it is not on the path by default) and
``from mooncake.store import MooncakeDistributedStore`` runs against a
Crescent master. Only the store is provided.
"""
