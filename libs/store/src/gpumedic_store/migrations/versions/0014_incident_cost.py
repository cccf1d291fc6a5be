"""What each incident cost: the GPU time it kept from work and its price (gpumedic_store.cost).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 12:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("incidents") as batch:
        batch.add_column(sa.Column("cost", sa.JSON(), nullable=True, comment="What it cost and how that was worked out (gpumedic_store.cost)."))
        batch.add_column(sa.Column("gpu_hours", sa.Float(), nullable=True,
                                   comment="GPU-hours it kept from work, as of its last event (final once closed)."))
        batch.add_column(sa.Column("cost_usd", sa.Float(), nullable=True, comment="Their price in dollars, where a price is known."))


def downgrade() -> None:
    with op.batch_alter_table("incidents") as batch:
        batch.drop_column("cost_usd")
        batch.drop_column("gpu_hours")
        batch.drop_column("cost")
