"""Recall: the memories of one profile most similar to a query, read from the store
(``search``); the pure ranking it stands on is ``engines.ranking``."""
