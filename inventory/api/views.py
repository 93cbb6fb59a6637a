"""``/api/v1/gpus/suspect/``: GPUs in a straggler's cool-down; an admin clears a mark.

::

    GET    /api/v1/gpus/suspect/          every GPU whose suspect mark is in effect
    DELETE /api/v1/gpus/{index}/suspect/  clear GPU index's mark (204; audited)

Cluster admins only: anybody else signed in gets a 403, as for the audit log
(the inventory is the cluster's, no tenant's).  Clearing an unknown GPU is a
404, one that is not suspect a 409; neither changes anything.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from inventory.api.serializers import SuspectGpuSerializer
from inventory.models import Gpu
from inventory.services import InventoryError, do_clear_gpu_suspect, suspect_gpus

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
