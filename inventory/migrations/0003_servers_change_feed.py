"""Server and GPU rows say which transaction last changed what the tick reads of them.

On PostgreSQL each table gets a ``row_txid`` column (not a model field: nothing
in Python writes it), set by a trigger to the writing transaction's id when a
row is inserted or when an update changes what the scheduler tick reads: a
server's name, position, state or whether it ever beat; a GPU's server, index
or suspect mark.  A heartbeat (its time, the agent's info) leaves it alone, so
it costs nothing and keeps its HOT update.  The tick's kept state
(``control.incremental``) then asks whether any such row was written since its
last read, through the column's index, instead of hashing every server's row
each tick (about 4 ms at 2,048 servers).  Elsewhere (SQLite) nothing is added:
the tick rebuilds in full there.
"""

from django.db import migrations

_CREATE = """
CREATE OR REPLACE FUNCTION inventory_row_txid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.row_txid := pg_current_xact_id()::text::bigint;
    RETURN NEW;
END
$$;
ALTER TABLE portal_server ADD COLUMN row_txid bigint NOT NULL DEFAULT 0;
CREATE INDEX portal_server_row_txid ON portal_server (row_txid);
CREATE TRIGGER portal_server_row_txid_insert BEFORE INSERT ON portal_server
    FOR EACH ROW EXECUTE FUNCTION inventory_row_txid();
CREATE TRIGGER portal_server_row_txid_update BEFORE UPDATE ON portal_server
    FOR EACH ROW WHEN (
        OLD.node IS DISTINCT FROM NEW.node
        OR OLD.leaf IS DISTINCT FROM NEW.leaf
        OR OLD.slot IS DISTINCT FROM NEW.slot
        OR OLD.state IS DISTINCT FROM NEW.state
        OR (OLD.last_heartbeat IS NULL) <> (NEW.last_heartbeat IS NULL)
    ) EXECUTE FUNCTION inventory_row_txid();
ALTER TABLE portal_gpu ADD COLUMN row_txid bigint NOT NULL DEFAULT 0;
CREATE INDEX portal_gpu_row_txid ON portal_gpu (row_txid);
CREATE TRIGGER portal_gpu_row_txid_insert BEFORE INSERT ON portal_gpu
    FOR EACH ROW EXECUTE FUNCTION inventory_row_txid();
CREATE TRIGGER portal_gpu_row_txid_update BEFORE UPDATE ON portal_gpu
    FOR EACH ROW WHEN (
        OLD.server_id IS DISTINCT FROM NEW.server_id
        OR OLD."index" IS DISTINCT FROM NEW."index"
        OR OLD.suspect_until IS DISTINCT FROM NEW.suspect_until
    ) EXECUTE FUNCTION inventory_row_txid();
"""
_DROP = """
DROP TRIGGER IF EXISTS portal_gpu_row_txid_update ON portal_gpu;
DROP TRIGGER IF EXISTS portal_gpu_row_txid_insert ON portal_gpu;
ALTER TABLE portal_gpu DROP COLUMN IF EXISTS row_txid;
DROP TRIGGER IF EXISTS portal_server_row_txid_update ON portal_server;
DROP TRIGGER IF EXISTS portal_server_row_txid_insert ON portal_server;
ALTER TABLE portal_server DROP COLUMN IF EXISTS row_txid;
DROP FUNCTION IF EXISTS inventory_row_txid();
"""


def _on_postgresql(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [("inventory", "0002_gpu_suspect")]
    operations = [migrations.RunPython(_on_postgresql(_CREATE), _on_postgresql(_DROP))]
