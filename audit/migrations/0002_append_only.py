"""On PostgreSQL the database itself refuses UPDATE and DELETE of audit rows.

The model refuses them in Python (``audit.models``); this trigger also stops raw
SQL and any code path that bypasses the ORM.  TRUNCATE (a test database being
flushed) is not a row-level event and still works.  SQLite, the embedded
default, relies on the model alone.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only: % is not allowed', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON audit_auditentry
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
"""
DROP = """
DROP TRIGGER IF EXISTS audit_append_only ON audit_auditentry;
DROP FUNCTION IF EXISTS audit_append_only();
"""


def _run(sql: str):
    def apply(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql, params=None)

    return apply


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]
    operations = [migrations.RunPython(_run(CREATE), _run(DROP))]
