"""``/api/v1/environments/``: every node's environment cache, and an admin's eviction.

::

    GET  /api/v1/environments/                     each node's latest cache report
    POST /api/v1/environments/{node}/{key}/evict/  ask node's agent to evict key (202; audited)
    GET  /api/v1/environments/evictions/           the latest evictions and their answers

Cluster admins only: anybody else signed in gets a 403, as for the suspect
GPUs (the caches are the cluster's, no tenant's).  An unknown node is a 404,
a malformed key a 400; neither sends or records anything.  The agent answers
an eviction later: ``outcome`` stays ``pending`` until it does.

It is jobs' API: the caches and evictions are ``jobs.environment_caches``'s.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from inventory.models import Server
from jobs.environment_caches import (
    EvictionError,
    NodeCache,
    do_request_eviction,
    node_caches,
    recent_evictions,
)
from jobs.models import EnvironmentEviction, EvictionOutcome

ADMINS_ONLY = "only a cluster admin may read or evict nodes' environments"


class CachedEnvironmentSerializer(serializers.Serializer[object]):
    """One environment of a node's cache."""

    key = serializers.CharField(help_text="The environment's key (32 hexadecimal digits).")
    size_bytes = serializers.IntegerField()
    last_used_at = serializers.DateTimeField()
    in_use = serializers.BooleanField(help_text="A worker on the node ran in it at the report.")
    requirements = serializers.ListField(child=serializers.CharField(), help_text="What was asked.")
    packages = serializers.ListField(
        child=serializers.CharField(), help_text="What it installed (name==version)."
    )
    packages_omitted = serializers.IntegerField(help_text="Packages the report left out.")
    built_at = serializers.DateTimeField(allow_null=True)
    build_s = serializers.FloatField(allow_null=True)


class NodeCacheSerializer(serializers.Serializer[object]):
    """A node's environment cache as its agent last reported it (nulls: never reported)."""

    node = serializers.CharField()
    reported_at = serializers.DateTimeField(allow_null=True)
    max_bytes = serializers.IntegerField(allow_null=True, help_text="The cache's cap.")
    total_bytes = serializers.IntegerField(allow_null=True)
    omitted = serializers.IntegerField(help_text="Environments the report did not list.")
    entries = CachedEnvironmentSerializer(many=True)


class EvictionSerializer(serializers.Serializer[object]):
    """An eviction asked for, and the agent's answer once it came."""

    id = serializers.IntegerField()
    node = serializers.CharField(source="server.node")
    key = serializers.CharField()
    requested_by = serializers.CharField(source="requested_by.username", allow_null=True)
    requested_at = serializers.DateTimeField()
    outcome = serializers.ChoiceField(choices=EvictionOutcome.choices)
    detail = serializers.CharField()
    answered_at = serializers.DateTimeField(allow_null=True)


def _admins_only(request: Request) -> None:
    if not request.user.is_staff:
        raise PermissionDenied(ADMINS_ONLY)


def _node_row(each: NodeCache) -> dict[str, Any]:
    cache = each.cache
    return {
        "node": each.node,
        "reported_at": None if cache is None else cache.reported_at,
        "max_bytes": None if cache is None else cache.max_bytes,
        "total_bytes": None if cache is None else cache.total_bytes,
        "omitted": 0 if cache is None else cache.omitted,
        "entries": list(each.entries),
    }


class EnvironmentCacheList(APIView):
    """Every node's environment cache, its entries most recently used first."""

    @extend_schema(responses=NodeCacheSerializer(many=True))
    def get(self, request: Request) -> Response:
        """Each server's latest cache report, by node name."""
        _admins_only(request)
        rows = [_node_row(each) for each in node_caches()]
        return Response(NodeCacheSerializer(rows, many=True).data)


class EnvironmentEvict(APIView):
    """Evict one environment from one node's cache."""

    @extend_schema(request=None, responses={202: EvictionSerializer})
    def post(self, request: Request, node: str, key: str) -> Response:
        """Send the eviction to the node's agent (audited as ``environment.evict``); 202."""
        _admins_only(request)
        if "\x00" in node or not Server.objects.filter(node=node).exists():
            raise NotFound()
        try:
            eviction = do_request_eviction(node=node, key=key, user=request.user)
        except EvictionError as exc:
            raise ValidationError({"key": [str(exc)]}) from None
        fresh = EnvironmentEviction.objects.select_related("server", "requested_by").get(
            pk=eviction.pk
        )
        return Response(EvictionSerializer(fresh).data, status=status.HTTP_202_ACCEPTED)


class EvictionList(APIView):
    """The latest evictions asked for, and what the agents answered."""

    @extend_schema(responses=EvictionSerializer(many=True))
    def get(self, request: Request) -> Response:
        """The latest evictions, latest first."""
        _admins_only(request)
        return Response(EvictionSerializer(recent_evictions(), many=True).data)
