"""Inventory's models, moved from the portal app.

State only: the tables keep their names (portal_fabric, portal_server, portal_gpu) and their rows; nothing in
the database changes.  Fresh databases get the tables from the portal app's
0001/0002 migrations, existing ones already have them.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('portal', '0002_inventory'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Fabric',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('leaves', models.PositiveIntegerField()),
                        ('spines', models.PositiveIntegerField()),
                        ('servers_per_leaf', models.PositiveIntegerField()),
                        ('gpus_per_server', models.PositiveIntegerField()),
                        ('link_gbps', models.FloatField(default=100.0)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                    ],
                    options={
                        'db_table': 'portal_fabric',
                        'constraints': [models.CheckConstraint(condition=models.Q(('pk', 1)), name='single_fabric')],
                    },
                ),
                migrations.CreateModel(
                    name='Server',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('node', models.CharField(max_length=64, unique=True)),
                        ('leaf', models.PositiveIntegerField()),
                        ('slot', models.PositiveIntegerField()),
                        ('state', models.CharField(choices=[('up', 'Up'), ('draining', 'Draining'), ('down', 'Down')], default='up', max_length=10)),
                        ('state_reason', models.CharField(blank=True, default='', max_length=200)),
                        ('last_heartbeat', models.DateTimeField(blank=True, null=True)),
                        ('agent_info', models.JSONField(blank=True, default=dict)),
                    ],
                    options={
                        'db_table': 'portal_server',
                        'ordering': ['leaf', 'slot'],
                        'constraints': [models.UniqueConstraint(fields=('leaf', 'slot'), name='one_server_per_position')],
                    },
                ),
                migrations.CreateModel(
                    name='Gpu',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('index', models.PositiveIntegerField(help_text='Global id in the fabric.', unique=True)),
                        ('local', models.PositiveIntegerField(help_text='Device index on its server.')),
                        ('server', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='gpu_set', to='inventory.server')),
                    ],
                    options={
                        'db_table': 'portal_gpu',
                        'ordering': ['index'],
                        'constraints': [models.UniqueConstraint(fields=('server', 'local'), name='one_gpu_per_device')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
