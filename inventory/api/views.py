"""Inventory's API: servers, pending servers, suspect GPUs.

::

    GET    /api/v1/servers/                 every server: type, pool, state, health
    GET    /api/v1/servers/pending/         servers that reported themselves, not accepted
    POST   /api/v1/servers/{id}/accept/     accept pending server id onto {"leaf", "slot"?,
                                            "gpu_type"?, "labels"?} (audited)
    POST   /api/v1/servers/pending/{id}/forget/
                                            forget pending server id (204; audited): it
                                            comes back, saying so, if it reports again
    POST   /api/v1/servers/{node}/type/     set its {"gpu_type", "labels"?} (audited; a new type
                                            while jobs hold its GPUs is a 409)
    GET    /api/v1/gpus/suspect/            every GPU whose suspect mark is in effect
    DELETE /api/v1/gpus/{index}/suspect/    clear GPU index's mark (204; audited)

Cluster admins only: anybody else signed in gets a 403, as for the audit log
(the inventory is the cluster's, no tenant's).  Clearing an unknown GPU is a
404, one that is not suspect a 409; neither changes anything.  Accepting or
forgetting a pending server that is not listed (never was, accepted, or
forgotten and silent since) is a 404 that changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from inventory.api.serializers import (
    AcceptServerSerializer,
    PendingServerSerializer,
    ServerRowSerializer,
    ServerTypeSerializer,
    SuspectGpuSerializer,
)
from inventory.listing import pending_rows, server_rows
from inventory.models import Gpu, PendingServer, Server
from inventory.registration import do_accept_server, do_forget_pending_server
from inventory.services import (
    InventoryConflict,
    InventoryError,
    do_clear_gpu_suspect,
    do_set_server_type,
    suspect_gpus,
)

ADMINS_ONLY = "only a cluster admin may read or clear suspect GPUs"


class Conflict(serializers.ValidationError):
    """A 409: the GPU is not in the state the request needs."""

    status_code = status.HTTP_409_CONFLICT


def _admins_only(request: Request) -> None:
    if not request.user.is_staff:
        raise PermissionDenied(ADMINS_ONLY)


class SuspectGpuList(APIView):
    """GPUs whose suspect mark is in effect: new placements and scale-outs avoid them."""

    @extend_schema(responses=SuspectGpuSerializer(many=True))
    def get(self, request: Request) -> Response:
        """Every suspect GPU, by index."""
        _admins_only(request)
        rows = [mark.as_dict() for mark in suspect_gpus()]
        return Response(SuspectGpuSerializer(rows, many=True).data)


class SuspectGpuMark(APIView):
    """One GPU's suspect mark: an admin clears it, returning the GPU to new placements."""

    @extend_schema(responses={204: None})
    def delete(self, request: Request, index: int) -> Response:
        """Clear the mark (audited as ``gpu.clear_suspect``)."""
        _admins_only(request)
        if not Gpu.objects.filter(index=index).exists():
            raise NotFound()
        try:
            do_clear_gpu_suspect(gpu=index, user=request.user)
        except InventoryError as exc:
            raise Conflict({"gpu": [str(exc)]}) from None
        return Response(status=status.HTTP_204_NO_CONTENT)


class ServerList(APIView):
    """Every server: type, pool, state (and why), health, GPUs (``portalctl nodes``)."""

    @extend_schema(responses=ServerRowSerializer(many=True))
    def get(self, request: Request) -> Response:
        """Every server, by position."""
        _admins_only(request)
        return Response(server_rows())


class PendingServerList(APIView):
    """Servers whose agents reported themselves and wait for an admin to accept them."""

    @extend_schema(responses=PendingServerSerializer(many=True))
    def get(self, request: Request) -> Response:
        """Every pending server, by node name."""
        _admins_only(request)
        return Response(pending_rows())


class AcceptServer(APIView):
    """Accept a pending server onto a leaf: it becomes a server whose GPUs the tick schedules."""

    @extend_schema(request=AcceptServerSerializer, responses=ServerRowSerializer)
    def post(self, request: Request, pending: int) -> Response:
        """Accept (audited as ``server.accept``); a bad field is a 400 that changes nothing."""
        _admins_only(request)
        if not PendingServer.listed().filter(pk=pending).exists():
            raise NotFound()
        body = request.data if isinstance(request.data, Mapping) else {}
        fields = {k: body.get(k) for k in ("leaf", "slot", "gpu_type", "labels")}
        try:
            server = do_accept_server(pending=pending, user=request.user, **fields)
        except InventoryError as exc:
            raise serializers.ValidationError({exc.field or "pending": [str(exc)]}) from None
        row = next(r for r in server_rows() if r["node"] == server.node)
        return Response(row)


class ForgetPendingServer(APIView):
    """Forget a pending server: it leaves the list (and comes back if its agent reports again)."""

    @extend_schema(
        request=None,
        responses={204: None},
        summary="Forget a pending server; it comes back if it reports again (admins)",
    )
    def post(self, request: Request, pending: int) -> Response:
        """Forget (audited as ``server.forget``); an id not listed is a 404 that changes nothing."""
        _admins_only(request)
        try:
            do_forget_pending_server(pending=pending, user=request.user)
        except InventoryError:
            raise NotFound() from None
        return Response(status=status.HTTP_204_NO_CONTENT)


class ServerTypeView(APIView):
    """Set a server's GPU type and labels (its pool among them)."""

    @extend_schema(
        request=ServerTypeSerializer,
        responses=ServerRowSerializer,
        summary="Set a server's GPU type and labels (admins)",
    )
    def post(self, request: Request, node: str) -> Response:
        """Audited as ``server.retype``; a bad field is a 400, a new type under jobs a 409."""
        _admins_only(request)
        server = Server.objects.filter(node=node).first() if "\x00" not in node else None
        if server is None:
            raise NotFound()
        body = request.data if isinstance(request.data, Mapping) else {}
        labels = body.get("labels", server.labels)
        try:
            do_set_server_type(
                node=node,
                gpu_type=body.get("gpu_type", server.gpu_type),
                labels=labels,
                user=request.user,
            )
        except InventoryConflict as exc:
            raise Conflict({exc.field or "gpu_type": [str(exc)]}) from None
        except InventoryError as exc:
            raise serializers.ValidationError({exc.field or "gpu_type": [str(exc)]}) from None
        return Response(next(r for r in server_rows() if r["node"] == node))
