"""Each dead letter's replay, kept so that a replay happens at most once.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dead_letter_replays",
        sa.Column("original", sa.String(64), nullable=False, comment="STREAM:SEQ of the refused message."),
        sa.Column("dead_letter_seq", sa.Integer(), nullable=False,
                  comment="The dead letter replayed (its sequence in the dead-letter stream)."),
        sa.Column("service", sa.String(63), nullable=False, comment="The service that refused it (its consumer reads the subject)."),
        sa.Column("subject", sa.String(512), nullable=False),
        sa.Column("replayed_by", sa.String(128), nullable=False),
        sa.Column("replayed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("result", sa.Text(), nullable=False, comment="What it became (stored as STREAM #SEQ); empty while publishing."),
        sa.PrimaryKeyConstraint("original", name=op.f("pk_dead_letter_replays")),
    )


def downgrade() -> None:
    op.drop_table("dead_letter_replays")
