"""The code bundle of a session started without code: a portal-built archive holding a README.

Every job that runs on a node names a bundle; a session need not bring one. The archive is
built byte for byte the same every time (fixed names, times, owners and gzip header), so its
sha256 is fixed too and it is stored once per tenant, like any upload (``bundles.services``:
the same bytes uploaded again return the bundle already there).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from typing import Any

from django.core.files.uploadedfile import SimpleUploadedFile

from bundles.models import CodeBundle
from bundles.services import do_upload
from tenancy.models import Tenant

README_NAME = "README.md"
README = b"""# Your session

This session was started without code of its own. Files you keep in your home folder
(the one JupyterLab opens in) are saved when the session stops and come back in your
next session of the same tenant, up to the tenant's home quota.
"""
ARCHIVE_NAME = "session-empty.tar.gz"


def empty_archive() -> bytes:
    """The archive's bytes: a ``.tar.gz`` of ``README.md`` alone, the same on every call."""
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(README_NAME)
        info.size = len(README)
        info.mtime = 0
        info.mode = 0o644
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        tar.addfile(info, io.BytesIO(README))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz:
        gz.write(tar_bytes.getvalue())
    return out.getvalue()


def empty_bundle(*, user: Any, tenant: Tenant) -> CodeBundle:
    """``tenant``'s bundle of :func:`empty_archive`: stored and recorded on first use by
    ``user`` (who must be able to write in ``tenant``), the same row afterwards."""
    data = empty_archive()
    stored = CodeBundle.objects.filter(tenant=tenant, sha256=hashlib.sha256(data).hexdigest())
    found: CodeBundle | None = stored.first()
    if found is not None:
        return found
    upload = SimpleUploadedFile(ARCHIVE_NAME, data, content_type="application/gzip")
    bundle, _ = do_upload(user=user, tenant=tenant, uploaded_file=upload)
    return bundle
