"""Embeddings move from the memory row to a table of their own (``memoryvector``).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "memoryvector",
        sa.Column("memory_id", sa.String(), nullable=False),
        sa.Column("embedding", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["memory_id"], ["memory.id"]),
        sa.PrimaryKeyConstraint("memory_id"),
    )
    op.execute(
        "INSERT INTO memoryvector (memory_id, embedding) "
        "SELECT id, embedding FROM memory WHERE embedding IS NOT NULL"
    )
    # SQLite cannot drop a column in place everywhere: batch mode copies the table.
    with op.batch_alter_table("memory") as batch:
        batch.drop_column("embedding")


def downgrade() -> None:
    with op.batch_alter_table("memory") as batch:
        batch.add_column(sa.Column("embedding", sa.LargeBinary(), nullable=True))
    op.execute(
        "UPDATE memory SET embedding = (SELECT v.embedding FROM memoryvector v "
        "WHERE v.memory_id = memory.id)"
    )
    op.drop_table("memoryvector")
