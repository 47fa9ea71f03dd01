"""Events wait in the store (``event_outbox``) until the Prefect API has taken them.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "event_outbox",
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("profile_id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=True),
        sa.Column("occurred_at", sa.DateTime(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("claimed_by", sa.String(), nullable=True),
        sa.Column("claimed_until", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("key", name="uq_event_outbox_key"),
    )


def downgrade() -> None:
    # Events still waiting are dropped with the table: the older code cannot send them.
    op.drop_table("event_outbox")
