"""Jobs point at tenancy.Tenant and inventory.Gpu (moved from the portal app).

State only: the tables keep their names (portal_tenant, portal_gpu) and their rows; nothing in
the database changes.  Fresh databases get the tables from the portal app's
0001/0002 migrations, existing ones already have them.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('inventory', '0001_initial'),
        ('jobs', '0006_measured_curve'),
        ('tenancy', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='job',
                    name='tenant',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='jobs', to='tenancy.tenant'),
                ),
                migrations.AlterField(
                    model_name='jobgpu',
                    name='gpu',
                    field=models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='assignment', to='inventory.gpu'),
                ),
            ],
            database_operations=[],
        ),
    ]
