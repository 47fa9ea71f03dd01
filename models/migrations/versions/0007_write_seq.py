"""Profiles count the write transactions that touched them (``write_seq``): a server
keeps a profile's vectors while the count holds still, and reads them again when any
write (an ingest, a consolidation step, an undo, a forget, a decay) has moved it.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A cache starts empty with the process: any starting value is as good as 0.
    op.add_column("profile", sa.Column("write_seq", sa.Integer(), nullable=False,
                                       server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("profile") as batch:
        batch.drop_column("write_seq")
