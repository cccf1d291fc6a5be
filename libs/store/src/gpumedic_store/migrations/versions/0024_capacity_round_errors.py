"""Each capacity check keeps why the provider's workers or the task database could not be read,
apart: `gpumedic report` checks each with the autoscaler's own credentials (runbook 001's API and
database checks) instead of holding them itself.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28 21:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | Sequence[str] | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("capacity_checks") as batch:
        batch.add_column(sa.Column("provider_error", sa.Text(), nullable=True,
                                   comment="Why the provider's workers could not be listed this round."))
        batch.add_column(sa.Column("demand_error", sa.Text(), nullable=True,
                                   comment="Why the task database (the demand source) could not be read this round."))


def downgrade() -> None:
    with op.batch_alter_table("capacity_checks") as batch:
        batch.drop_column("demand_error")
        batch.drop_column("provider_error")
