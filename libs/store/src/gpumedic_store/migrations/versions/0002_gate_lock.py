"""The remediator's gate decides one request at a time, and the database backs "one action per node".

`gate_lock` holds one row that every gate decision (and every breaker reset) locks first with an
UPDATE, so decisions are serialised across remediator instances on SQLite and PostgreSQL alike:
never two breaker trips, never two actions let through on one node. A partial unique index also
refuses a second `executing` action on one node, whatever the code does.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_EXECUTING = sa.text("status = 'executing'")


def upgrade() -> None:
    gate_lock = op.create_table(
        "gate_lock",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("decisions", sa.Integer(), nullable=False, comment="Gate decisions taken; bumped to take the lock."),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gate_lock")),
    )
    op.bulk_insert(gate_lock, [{"id": 1, "decisions": 0}])
    op.create_index(
        "uq_actions_one_executing_per_node",
        "actions",
        ["node_id"],
        unique=True,
        sqlite_where=_EXECUTING,
        postgresql_where=_EXECUTING,
    )


def downgrade() -> None:
    op.drop_index("uq_actions_one_executing_per_node", table_name="actions")
    op.drop_table("gate_lock")
