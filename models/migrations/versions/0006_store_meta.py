"""The store knows its own id (``store_meta``): events name it, so that a Prefect
automation serving one store never reacts to another store's events.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    meta = op.create_table(
        "store_meta",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.String(length=200), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    # An existing store gets its id now: random, as a new store's is.
    op.bulk_insert(meta, [{"key": "store_id", "value": uuid.uuid4().hex}])


def downgrade() -> None:
    op.drop_table("store_meta")
