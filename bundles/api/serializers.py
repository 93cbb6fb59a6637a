"""Serializers of the code API: a bundle as clients see it, and the upload's shape."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from bundles.models import CodeBundle
from tenancy.models import Tenant


class CodeBundleSerializer(serializers.ModelSerializer[CodeBundle]):
    """A bundle in a list, and the answer to an upload: its id is the archive's sha256."""

    id = serializers.CharField(source="sha256", read_only=True)
    files = serializers.IntegerField(source="file_count", read_only=True)
    tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    requirements = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="What its top-level requirements.txt or pyproject.toml declares, normalised "
        "(installed before a job's own environment.requirements).",
    )

    class Meta:
        model = CodeBundle
        fields = ["id", "size", "files", "requirements", "created_at", "tenant"]
        read_only_fields = fields


class BundleFileSerializer(serializers.Serializer[Any]):
    """One file inside a bundle."""

    path = serializers.CharField()
    size = serializers.IntegerField()


class CodeBundleDetailSerializer(CodeBundleSerializer):
    """One bundle with the list of its files."""

    file_list = BundleFileSerializer(source="files", many=True, read_only=True)
    unpacked_bytes = serializers.IntegerField(read_only=True)
    kind = serializers.CharField(read_only=True)

    class Meta(CodeBundleSerializer.Meta):
        fields = [*CodeBundleSerializer.Meta.fields, "kind", "unpacked_bytes", "file_list"]
        read_only_fields = fields


class CodeUploadSerializer(serializers.Serializer[CodeBundle]):
    """What a client sends to upload a bundle (multipart/form-data)."""

    archive = serializers.FileField(help_text="A .tar.gz, .tgz or .zip archive.")
    tenant = serializers.SlugField(
        required=False, help_text="Tenant slug; required only if you belong to several."
    )
