"""The action ledger becomes an audit log: per command, its exit status, a digest of its output and
its timing.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 19:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("actions") as batch:
        batch.add_column(
            sa.Column(
                "audit",
                sa.JSON(),
                nullable=False,
                server_default="[]",
                comment="Per command run: exit status, output digest and size, start offset and duration.",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("actions") as batch:
        batch.drop_column("audit")
