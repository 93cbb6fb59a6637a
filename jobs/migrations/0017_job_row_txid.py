"""Each job row says which transaction last wrote it: the tick's change feed.

On PostgreSQL a ``BEFORE INSERT OR UPDATE`` trigger sets ``row_txid`` to the
writing transaction's id (``pg_current_xact_id()``, 64 bits: it never wraps),
whoever writes the row: a report, another replica's tick, an admin's SQL.  The
tick's kept state (``control.incremental``) then reads only the rows written
since its last refresh (``row_txid`` at or above that refresh's snapshot
horizon), through the index, instead of every active job's version each tick.
Elsewhere (SQLite) the column stays 0 and the tick rebuilds in full anyway.
"""

from django.db import migrations, models

_CREATE = """
CREATE OR REPLACE FUNCTION jobs_job_row_txid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.row_txid := pg_current_xact_id()::text::bigint;
    RETURN NEW;
END
$$;
CREATE TRIGGER jobs_job_row_txid BEFORE INSERT OR UPDATE ON jobs_job
    FOR EACH ROW EXECUTE FUNCTION jobs_job_row_txid();
"""
_DROP = """
DROP TRIGGER IF EXISTS jobs_job_row_txid ON jobs_job;
DROP FUNCTION IF EXISTS jobs_job_row_txid();
"""


def _on_postgresql(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0016_environment_used"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="row_txid",
            field=models.BigIntegerField(
                db_index=True,
                default=0,
                editable=False,
                help_text="The transaction that last wrote this row (PostgreSQL: set by a trigger on every insert and update, whoever writes; 0 elsewhere): the tick's change feed.",
            ),
        ),
        migrations.RunPython(_on_postgresql(_CREATE), _on_postgresql(_DROP)),
    ]
