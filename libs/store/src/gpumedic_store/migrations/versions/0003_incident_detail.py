"""Incidents say more (detector, severity, diagnosis, recommended action, occurrences, the incident
they belong to, the silence that covered them); silences are kept; operators' verdicts are kept
(the false-positive ledger).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("incidents") as batch:
        batch.add_column(sa.Column("detector", sa.String(length=63), nullable=False, server_default="", comment="The service that opened it."))
        batch.add_column(sa.Column("severity", sa.String(length=16), nullable=False, server_default="warning"))
        batch.add_column(sa.Column("diagnosis", sa.JSON(), nullable=True, comment="The named cause, its confidence and remedies."))
        batch.add_column(sa.Column("recommended_action", sa.Text(), nullable=False, server_default=""))
        batch.add_column(sa.Column("occurrences", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(
            sa.Column("related_incident_id", sa.String(length=36), nullable=True, comment="The incident it belongs to (a fleet incident).")
        )
        batch.add_column(sa.Column("silence_id", sa.String(length=36), nullable=True, comment="The silence that covered it."))
        batch.create_check_constraint("severity", "severity IN ('info', 'warning', 'critical')")
        batch.create_index(batch.f("ix_incidents_related_incident_id"), ["related_incident_id"])
    op.create_table(
        "silences",
        sa.Column("id", sa.String(length=36), nullable=False, comment="The silence id."),
        sa.Column("node_id", sa.String(length=63), nullable=True, comment="Only this node; NULL: every node."),
        sa.Column("kind", sa.String(length=64), nullable=True, comment="Only this kind; NULL: every kind."),
        sa.Column("gpu_index", sa.Integer(), nullable=True),
        sa.Column("starts_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ends_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("removed_by", sa.String(length=128), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_silences")),
    )
    op.create_index(op.f("ix_silences_ends_at"), "silences", ["ends_at"])
    op.create_table(
        "incident_marks",
        sa.Column("incident_id", sa.String(length=36), nullable=False),
        sa.Column("verdict", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("marked_by", sa.String(length=128), nullable=False),
        sa.Column("marked_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("verdict IN ('false_positive')", name=op.f("ck_incident_marks_verdict")),
        sa.PrimaryKeyConstraint("incident_id", "verdict", name=op.f("pk_incident_marks")),
    )


def downgrade() -> None:
    op.drop_table("incident_marks")
    op.drop_index(op.f("ix_silences_ends_at"), table_name="silences")
    op.drop_table("silences")
    with op.batch_alter_table("incidents") as batch:
        batch.drop_index(batch.f("ix_incidents_related_incident_id"))
        batch.drop_constraint("severity", type_="check")
        for column in ("silence_id", "related_incident_id", "occurrences", "recommended_action", "diagnosis", "severity", "detector"):
            batch.drop_column(column)
