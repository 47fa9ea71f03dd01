"""The memory store: profiles, memories, edges, Core Memory blocks, the consolidation
audit and tombstones.

Revision ID: 0001
Revises: none
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "consolidation",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("profile_id", sa.String(length=128), nullable=False),
        sa.Column("run_id", sa.String(), nullable=True),
        sa.Column("operation", sa.String(), nullable=False),
        sa.Column("summary_id", sa.String(), nullable=True),
        sa.Column("member_ids", sa.JSON(), nullable=True),
        sa.Column("parameters", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("undone_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        op.f("ix_consolidation_profile_id"), "consolidation", ["profile_id"], unique=False
    )
    op.create_table(
        "coreblock",
        sa.Column("profile_id", sa.String(length=128), nullable=False),
        sa.Column("block_type", sa.String(), nullable=False),
        sa.Column("content", sa.String(), nullable=False),
        sa.Column("source_ids", sa.JSON(), nullable=True),
        sa.Column("mode", sa.String(), nullable=False),
        sa.Column("compiled_at", sa.DateTime(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("profile_id", "block_type"),
    )
    op.create_table(
        "edge",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("profile_id", sa.String(length=128), nullable=False),
        sa.Column("source_id", sa.String(), nullable=False),
        sa.Column("target_id", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("subkind", sa.String(), nullable=True),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("base_weight", sa.Float(), nullable=False),
        sa.Column("last_strengthened_at", sa.DateTime(), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_edge_profile_kind_time",
        "edge",
        ["profile_id", "kind", "last_strengthened_at"],
        unique=False,
    )
    op.create_index(op.f("ix_edge_source_id"), "edge", ["source_id"], unique=False)
    op.create_index(op.f("ix_edge_target_id"), "edge", ["target_id"], unique=False)
    op.create_table(
        "memory",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("profile_id", sa.String(length=128), nullable=False),
        sa.Column("external_id", sa.String(), nullable=True),
        sa.Column("content", sa.String(), nullable=False),
        sa.Column("content_hash", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("entity", sa.String(), nullable=True),
        sa.Column("layer", sa.String(), nullable=True),
        sa.Column("importance", sa.Float(), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=False),
        sa.Column("stability", sa.Float(), nullable=False),
        sa.Column("access_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("last_accessed_at", sa.DateTime(), nullable=True),
        sa.Column("valid_from", sa.DateTime(), nullable=True),
        sa.Column("valid_until", sa.DateTime(), nullable=True),
        sa.Column("session_id", sa.String(), nullable=True),
        sa.Column("status", sa.String(), nullable=True),
        sa.Column("protected", sa.Boolean(), nullable=False),
        sa.Column("lifecycle", sa.String(), nullable=False),
        sa.Column("tier", sa.String(), nullable=False),
        sa.Column("superseded_by", sa.String(), nullable=True),
        sa.Column("origin", sa.String(), nullable=False),
        sa.Column("linked_at", sa.DateTime(), nullable=True),
        sa.Column("relevance", sa.Float(), nullable=True),
        sa.Column("pagerank", sa.Float(), nullable=True),
        sa.Column("community", sa.Integer(), nullable=True),
        sa.Column("embedding", sa.LargeBinary(), nullable=True),
        sa.Column("embedding_model", sa.String(), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("profile_id", "external_id", name="uq_memory_profile_external"),
    )
    op.create_index(op.f("ix_memory_content_hash"), "memory", ["content_hash"], unique=False)
    op.create_index(op.f("ix_memory_profile_id"), "memory", ["profile_id"], unique=False)
    op.create_index("ix_memory_profile_tier", "memory", ["profile_id", "tier"], unique=False)
    op.create_table(
        "profile",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("store_count", sa.Integer(), nullable=False),
        sa.Column("session_count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "tombstone",
        sa.Column("memory_id", sa.String(), nullable=False),
        sa.Column("profile_id", sa.String(length=128), nullable=False),
        sa.Column("external_id", sa.String(), nullable=True),
        sa.Column("content_hash", sa.String(), nullable=False),
        sa.Column("reason", sa.String(), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("run_id", sa.String(), nullable=True),
        sa.Column("deleted_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("memory_id"),
    )
    op.create_index(op.f("ix_tombstone_profile_id"), "tombstone", ["profile_id"], unique=False)


def downgrade() -> None:
    op.drop_table("tombstone")
    op.drop_table("profile")
    op.drop_table("memory")
    op.drop_table("edge")
    op.drop_table("coreblock")
    op.drop_table("consolidation")
