"""Tenancy's models, moved from the portal app.

State only: the tables keep their names (portal_tenant, portal_membership) and their rows; nothing in
the database changes.  Fresh databases get the tables from the portal app's
0001/0002 migrations, existing ones already have them.
"""

import django.core.validators
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('portal', '0002_inventory'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Tenant',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('slug', models.SlugField(unique=True)),
                        ('name', models.CharField(max_length=100)),
                        ('gpu_quota', models.PositiveIntegerField(default=8, help_text="Most GPUs this tenant's jobs may hold at once.")),
                        ('priority_weight', models.FloatField(default=1.0, help_text="Relative weight of this tenant's jobs when the scheduler breaks ties.", validators=[django.core.validators.MinValueValidator(0.0)])),
                        ('profile_jobs', models.BooleanField(default=True, help_text="Profile each job's throughput curve on its first run.")),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        'db_table': 'portal_tenant',
                        'ordering': ['slug'],
                        'constraints': [models.CheckConstraint(condition=models.Q(('priority_weight__gte', 0)), name='tenant_weight_nonnegative')],
                    },
                ),
                migrations.CreateModel(
                    name='Membership',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('role', models.CharField(choices=[('owner', 'Owner'), ('member', 'Member'), ('viewer', 'Viewer')], default='member', max_length=10)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='memberships', to=settings.AUTH_USER_MODEL)),
                        ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='memberships', to='tenancy.tenant')),
                    ],
                    options={
                        'db_table': 'portal_membership',
                        'ordering': ['tenant__slug', 'user__username'],
                        'constraints': [models.UniqueConstraint(fields=('user', 'tenant'), name='one_membership_per_tenant')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
