"""A notification tells an escalation or, once that was told, the incident's end: the event joins
the notifications' key.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27 15:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("notifications", recreate="always") as batch:
        batch.add_column(sa.Column("event", sa.String(16), nullable=False, server_default="escalated",
                                   comment="What it tells: escalated, or resolved (once its escalation was told)."))
        batch.drop_constraint("pk_notifications", type_="primary")
        batch.create_primary_key("pk_notifications", ["incident_id", "channel", "event"])


def downgrade() -> None:
    op.execute("DELETE FROM notifications WHERE event <> 'escalated'")
    with op.batch_alter_table("notifications", recreate="always") as batch:
        batch.drop_constraint("pk_notifications", type_="primary")
        batch.create_primary_key("pk_notifications", ["incident_id", "channel"])
        batch.drop_column("event")
