"""Reverie: memory consolidation for AI agents, as Prefect flows.

The repository's root is this package: ``reverie.flows``, ``reverie.tasks``,
``reverie.models`` and ``reverie.deployments`` are its top-level folders.
"""
