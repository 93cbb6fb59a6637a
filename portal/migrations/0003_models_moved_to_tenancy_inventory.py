"""The portal app gives its models to the tenancy and inventory apps.

State only: the tables keep their names (portal_*) and their rows; nothing in
the database changes.  Fresh databases get the tables from the portal app's
0001/0002 migrations, existing ones already have them.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0007_models_moved_to_tenancy_inventory'),
        ('portal', '0002_inventory'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(
                    name='Fabric',
                ),
                migrations.RemoveField(
                    model_name='membership',
                    name='tenant',
                ),
                migrations.RemoveField(
                    model_name='membership',
                    name='user',
                ),
                migrations.DeleteModel(
                    name='Gpu',
                ),
                migrations.DeleteModel(
                    name='Server',
                ),
                migrations.DeleteModel(
                    name='Tenant',
                ),
                migrations.DeleteModel(
                    name='Membership',
                ),
            ],
            database_operations=[],
        ),
    ]
