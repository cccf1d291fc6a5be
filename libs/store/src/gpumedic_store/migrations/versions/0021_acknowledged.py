"""An operator's mark on an incident may also be an acknowledgement: who looks at it, since when.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-27 17:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("incident_marks") as batch:
        batch.drop_constraint("verdict", type_="check")
        batch.create_check_constraint("verdict", "verdict IN ('false_positive', 'acknowledged')")


def downgrade() -> None:
    op.execute("DELETE FROM incident_marks WHERE verdict = 'acknowledged'")
    with op.batch_alter_table("incident_marks") as batch:
        batch.drop_constraint("verdict", type_="check")
        batch.create_check_constraint("verdict", "verdict IN ('false_positive')")
