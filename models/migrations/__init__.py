"""Schema migrations of the memory store (Alembic). ``models.db`` applies them."""
