"""Profiles remember the id of the session that ended last (``last_session_id``): a
session end sent again for it (a client's retry) is not counted twice, nor its events
queued again.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("profile", sa.Column("last_session_id", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("profile") as batch:
        batch.drop_column("last_session_id")
