"""Memories carry the number of the ingest that last wrote them, profiles how many
ingests wrote theirs: a run works on what was stamped before it took the profile.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Rows stored before the upgrade count as written by ingest 0: every run sees them.
    op.add_column("profile", sa.Column("ingest_seq", sa.Integer(), nullable=False,
                                       server_default="0"))
    op.add_column("memory", sa.Column("ingest_seq", sa.Integer(), nullable=False,
                                      server_default="0"))
    op.create_index("ix_memory_profile_ingest_seq", "memory", ["profile_id", "ingest_seq"])


def downgrade() -> None:
    op.drop_index("ix_memory_profile_ingest_seq", table_name="memory")
    with op.batch_alter_table("memory") as batch:
        batch.drop_column("ingest_seq")
    with op.batch_alter_table("profile") as batch:
        batch.drop_column("ingest_seq")
