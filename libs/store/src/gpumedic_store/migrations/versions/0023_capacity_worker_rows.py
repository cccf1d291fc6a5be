"""Each capacity check keeps its workers' table (the provider's status, host and price beside the
task database's status, heartbeat age and task), as runbook 001's `workers` shows it.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28 14:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | Sequence[str] | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("capacity_checks") as batch:
        batch.add_column(sa.Column("worker_rows", sa.JSON(), nullable=False, server_default="[]",
                                   comment="Each live worker: provider status, host, $/h, the task database's status, heartbeat age and task."))


def downgrade() -> None:
    with op.batch_alter_table("capacity_checks") as batch:
        batch.drop_column("worker_rows")
