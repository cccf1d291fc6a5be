"""Escalations reach a person: report-builder's notification outbox, one row per incident and channel.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "notifications",
        sa.Column("incident_id", sa.String(length=36), nullable=False),
        sa.Column("channel", sa.String(length=32), nullable=False, comment="The channel's name, e.g. webhook, slack."),
        sa.Column("reason", sa.Text(), nullable=False, comment="Why a person is needed (the escalation's reason)."),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, comment="Delivery rounds tried (each with its own retries)."),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False, comment="When the next delivery round may start."),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False, comment="The last error, or why it was skipped."),
        sa.CheckConstraint("status IN ('pending', 'delivered', 'skipped', 'failed')", name=op.f("ck_notifications_status")),
        sa.PrimaryKeyConstraint("incident_id", "channel", name=op.f("pk_notifications")),
    )
    op.create_index(op.f("ix_notifications_status"), "notifications", ["status"])
    op.create_index(op.f("ix_notifications_due_at"), "notifications", ["due_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_notifications_due_at"), table_name="notifications")
    op.drop_index(op.f("ix_notifications_status"), table_name="notifications")
    op.drop_table("notifications")
