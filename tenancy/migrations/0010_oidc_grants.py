"""Remember the roles single sign-on gave (tenancy.models.OidcGrant), so that a later
sign-in takes them back when the groups no longer give them (issue 35).

Roles given before this migration are found as well as the record allows:

- a membership whose latest ``membership.add`` / ``membership.role`` audit row was made
  by single sign-on (``via`` "single sign-on (<issuer>)"), and whose role is still the
  one that row gave, is single sign-on's (the role before, from a ``membership.role``
  row, is what it replaced);
- staff was never audited: a user linked to the provider (``OidcIdentity``) who is staff
  but not a superuser counts as made staff by single sign-on when ``OIDC_ROLE_MAP`` has
  a ``staff`` rule now. Such a user who should stay staff regardless is made staff again
  in the admin after their next sign-in (docs/sso.md, "Upgrading").
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

SSO_VIA = "single sign-on ("
TENANT_ROLES = ("viewer", "member", "owner")


def remember_sso_grants(apps, schema_editor):  # type: ignore[no-untyped-def]
    entry_model = apps.get_model("audit", "AuditEntry")
    membership_model = apps.get_model("tenancy", "Membership")
    grant_model = apps.get_model("tenancy", "OidcGrant")
    identity_model = apps.get_model("tenancy", "OidcIdentity")
    latest = {}
    entries = entry_model.objects.filter(
        action__in=("membership.add", "membership.role"),
        object_type="tenancy.membership",
    ).order_by("at", "pk")
    for entry in entries.iterator():
        latest[entry.object_id] = entry
    sso = {key: entry for key, entry in latest.items() if entry.via.startswith(SSO_VIA)}
    ids = [int(key) for key in sso if key.isdigit()]
    for membership in membership_model.objects.filter(pk__in=ids):
        entry = sso[str(membership.pk)]
        if (entry.after or {}).get("role") != membership.role:
            continue  # changed since, in a way the log does not show as single sign-on's
        replaced = (entry.before or {}).get("role") if entry.action == "membership.role" else ""
        grant_model.objects.get_or_create(
            user_id=membership.user_id,
            tenant_id=membership.tenant_id,
            defaults={
                "role": membership.role,
                "replaced_role": replaced if replaced in TENANT_ROLES else "",
            },
        )
    config = getattr(settings, "OIDC", None)
    if config is None or not any(rule.role == "staff" for rule in config.role_map):
        return
    staff = identity_model.objects.filter(user__is_staff=True, user__is_superuser=False)
    for user_id in staff.values_list("user_id", flat=True):
        grant_model.objects.get_or_create(user_id=user_id, tenant=None, defaults={"role": "staff"})


class Migration(migrations.Migration):

    dependencies = [
        ('tenancy', '0009_tenant_max_token_days'),
        ('audit', '0002_append_only'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='OidcGrant',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('role', models.CharField(max_length=10)),
                ('replaced_role', models.CharField(blank=True, default='', max_length=10)),
                ('granted_at', models.DateTimeField(auto_now=True)),
                ('tenant', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='oidc_grants', to='tenancy.tenant')),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='oidc_grants', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('user', 'tenant'), name='one_oidc_grant_per_tenant'), models.UniqueConstraint(condition=models.Q(('tenant__isnull', True)), fields=('user',), name='one_oidc_staff_grant_per_user')],
            },
        ),
        migrations.RunPython(remember_sso_grants, migrations.RunPython.noop),
    ]
