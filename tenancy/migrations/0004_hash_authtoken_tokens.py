"""Every ``rest_framework.authtoken`` token becomes a hashed ``write`` API token named ``default``.

The same secret keeps working (its sha256 is what is looked up now); the
clear-text row is deleted, so no secret stays in the database. The converted
token expires ``API_TOKEN_DAYS`` after this migration runs. There is no way
back: a hash cannot give the secret again.
"""

import hashlib
from datetime import timedelta

from django.conf import settings
from django.db import migrations
from django.utils import timezone


def hash_old_tokens(apps, schema_editor):
    Token = apps.get_model("authtoken", "Token")
    ApiToken = apps.get_model("tenancy", "ApiToken")
    now = timezone.now()
    expires_at = now + timedelta(days=getattr(settings, "API_TOKEN_DAYS", 90))
    for old in Token.objects.all().iterator():
        ApiToken.objects.create(
            user_id=old.user_id,
            name="default",
            scope="write",
            key_hash=hashlib.sha256(old.key.encode()).hexdigest(),
            prefix=old.key[:8],
            created_at=old.created or now,
            expires_at=expires_at,
        )
    Token.objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [
        ("tenancy", "0003_api_tokens"),
        ("authtoken", "0004_alter_tokenproxy_options"),
    ]

    operations = [migrations.RunPython(hash_old_tokens, migrations.RunPython.noop)]
