"""Code bundle services: ``check_*`` functions validate, ``do_*`` functions change state.

An upload goes: permission, size, a private copy on disk, ``workers.bundle.inspect``
(every entry decompressed and counted, nothing unpacked), the requirements it
declares (``bundles.declared``: a bad ``requirements.txt`` refuses it), then the
archive into the artifact store, then the row.  A refusal stores nothing; a row that cannot be
written takes its stored object with it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.files.uploadedfile import UploadedFile
from django.db import IntegrityError, transaction

from audit import services as audit
from bundles.declared import declared_requirements
from bundles.errors import BundlePermissionError, BundleRefusedError, BundleTenantError
from bundles.models import CodeBundle
from tenancy.models import Tenant
from tenancy.services import TenancyError, can_write, choose_tenant
from workers.artifacts import ArtifactStore
from workers.bundle import BundleError, BundleInfo, BundleLimits, inspect


def bundle_limits() -> BundleLimits:
    """The limits on uploads, from the ``CODE_MAX_*`` settings."""
    return BundleLimits(
        max_files=settings.CODE_MAX_FILES,
        max_bytes=settings.CODE_MAX_BYTES,
        max_unpacked_bytes=settings.CODE_MAX_UNPACKED_BYTES,
    )


def artifact_store() -> ArtifactStore:
    """The cluster's artifact store (``ARTIFACT_URL``)."""
    return ArtifactStore(settings.ARTIFACT_URL)


def resolve_tenant_for_upload(user: AbstractBaseUser | AnonymousUser, slug: str | None) -> Tenant:
    """The tenant an upload goes to: the named one, or the user's only tenant.

    Chosen among the tenants the user can see, so that a read-only member is
    told they may not upload (403 from ``do_upload``) rather than that the
    tenant does not exist.
    """
    try:
        return choose_tenant(Tenant.objects.restrict(user), slug, "upload code")
    except TenancyError as exc:
        raise BundleTenantError(str(exc)) from None


def check_archive(*, local: Path, limits: BundleLimits) -> BundleInfo:
    """What the archive at ``local`` holds, or ``BundleRefusedError`` saying why it is refused."""
    try:
        return inspect(local, limits)
    except BundleError as exc:
        raise BundleRefusedError(str(exc)) from exc


def do_upload(
    *, user: AbstractBaseUser | AnonymousUser, tenant: Tenant, uploaded_file: UploadedFile
) -> tuple[CodeBundle, bool]:
    """Store ``uploaded_file`` as a bundle of ``tenant``; ``(bundle, created)``.

    The same bytes uploaded again to the same tenant return the existing bundle
    with ``created`` False, and store nothing new (and, changing nothing, leave
    no audit row); a new bundle is audited as ``code.upload`` with its row.
    """
    if not can_write(user, tenant):
        raise BundlePermissionError(f"your role in tenant {tenant.slug!r} is read-only")
    limits = bundle_limits()
    size = uploaded_file.size or 0
    if size > limits.max_bytes:
        raise BundleRefusedError(
            f"The archive is {size} bytes, over the limit of {limits.max_bytes} bytes."
        )
    with tempfile.TemporaryDirectory(prefix="bundle-") as scratch:
        local = Path(scratch) / "upload"
        _save_upload(uploaded_file, local, limits.max_bytes)
        info = check_archive(local=local, limits=limits)
        requirements = declared_requirements(local, info)
        existing = CodeBundle.objects.filter(tenant=tenant, sha256=info.sha256).first()
        if existing is not None:
            return existing, False
        bundle = CodeBundle(
            tenant=tenant,
            sha256=info.sha256,
            kind=info.kind,
            size=info.size,
            file_count=len(info.files),
            files=[{"path": f.path, "size": f.size} for f in info.files],
            unpacked_bytes=info.unpacked_bytes,
            requirements=list(requirements),
            uploaded_by_id=user.pk,  # can_write refused anonymous users
        )
        store = artifact_store()
        store.put_file(bundle.store_path, local)
    return _insert(bundle, store, user)


UPLOAD_AUDIT_FIELDS = ("sha256", "kind", "size", "file_count", "unpacked_bytes", "requirements")
"""What the audit log keeps of an upload (not the list of files)."""


def _insert(
    bundle: CodeBundle, store: ArtifactStore, user: AbstractBaseUser | AnonymousUser
) -> tuple[CodeBundle, bool]:
    """Write the row of a stored bundle and its audit row; on failure the stored object goes too."""
    try:
        with transaction.atomic():
            bundle.save()
            audit.record(
                "code.upload",
                obj=bundle,
                tenant=bundle.tenant,
                user=user,
                after=audit.snapshot(bundle, UPLOAD_AUDIT_FIELDS),
            )
    except IntegrityError:
        # The same bytes may have just been uploaded by someone else of the tenant:
        # their row owns the (identical) stored object, which must stay.
        winner = CodeBundle.objects.filter(tenant=bundle.tenant, sha256=bundle.sha256).first()
        if winner is not None:
            return winner, False
        store.delete(bundle.store_path)
        raise
    except BaseException:
        store.delete(bundle.store_path)
        raise
    return bundle, True


def _save_upload(uploaded_file: UploadedFile, local: Path, max_bytes: int) -> None:
    """Copy the upload to ``local``, refusing it as soon as it passes ``max_bytes``."""
    written = 0
    with local.open("wb") as out:
        for chunk in uploaded_file.chunks():
            written += len(chunk)
            if written > max_bytes:
                raise BundleRefusedError(f"The archive is over the limit of {max_bytes} bytes.")
            out.write(chunk)
