"""The ledger keeps each request's digest: an action id can be predicted, so a forged request sent
first under a real one's id must not stand for it (the real one is told apart by what it asks).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 21:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("actions") as batch:
        batch.add_column(sa.Column("request_sha256", sa.String(64), nullable=False, server_default="",
                                   comment="The request's digest (ActionRequested.request_sha256); '' before revision 0010."))


def downgrade() -> None:
    with op.batch_alter_table("actions") as batch:
        batch.drop_column("request_sha256")
