"""The portal's own error pages: every refusal looks like the portal, or is JSON for JSON callers.

    request ──> view raises / no route matches
                 │
                 ├─ Http404, no route ........ page_not_found   404
                 ├─ PermissionDenied ......... permission_denied 403   (also a CSRF failure)
                 ├─ JobError (409 and kin) ... ErrorPagesMiddleware  its own status
                 └─ anything else ............ server_error     500
                                                   │
                  JSON caller (/api/, *.json, Accept: JSON) ──> {"message": ..., "errors": {}}
                  a page ──> templates/error.html, inside the portal's header

Under ``DEBUG`` (``make run``) Django would answer a 404 with its technical page, which
lists every URL pattern; ``ErrorPagesMiddleware`` answers it with the portal's page
instead.  A 500 under ``DEBUG`` still shows Django's traceback: that is the developer's
tool, and ``portal.settings.safety`` keeps a DEBUG server on loopback hosts only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import Resolver404, resolve

from jobs.errors import JobError


@dataclass(frozen=True)
class ErrorText:
    """What a refusal is called on its page and what the page tells the user."""

    title: str
    message: str


TEXTS: dict[int, ErrorText] = {
    400: ErrorText("Bad request", "The request could not be understood."),
    403: ErrorText("Not allowed", "You may not do this here."),
    404: ErrorText("Not found", "There is nothing here, or it belongs to another tenant."),
    409: ErrorText("Not possible now", "The object's current state forbids this change."),
    500: ErrorText("Server error", "Something went wrong on our side; it has been logged."),
}

# One JSON message per status: a 404 must not hint at what exists elsewhere.
JSON_MESSAGES: dict[int, str] = {
    400: "Bad request.",
    403: "Permission denied.",
    404: "Not found.",
    409: "Conflict.",
    500: "Internal server error.",
}


def wants_json(request: HttpRequest) -> bool:
    """Whether the caller reads JSON: the API, a ``*.json`` endpoint, or ``Accept`` asks for it."""
    path = request.path
    if path.startswith("/api/") or path.endswith(".json"):
        return True
    accept = request.headers.get("Accept", "")
    return "application/json" in accept and "text/html" not in accept


def error_response(request: HttpRequest, status: int, message: str = "") -> HttpResponse:
    """The refusal ``status`` as JSON for JSON callers, else as the portal's page.

    ``message`` is shown instead of the status's standard text when the refusal has its
    own words (a job that is already over); it goes out as text, never as markup.
    """
    text = TEXTS.get(status, TEXTS[400 if status < 500 else 500])
    if wants_json(request):
        return JsonResponse(
            {"message": message or JSON_MESSAGES.get(status, text.title + "."), "errors": {}},
            status=status,
        )
    context = {"status": status, "title": text.title, "message": message or text.message}
    return render(request, "error.html", context, status=status)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """handler400."""
    return error_response(request, 400)


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """handler403: the message is the standard one, not the exception's internals."""
    return error_response(request, 403)


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """handler404: one wording whatever is missing (another tenant's job reads the same)."""
    return error_response(request, 404)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: a stale form is a 403 in the portal's page, with a way forward."""
    message = "This form has expired or came from another site. Reload the page and try again."
    return error_response(request, 403, message)


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: rendered without the request, so a broken database cannot break it too."""
    if wants_json(request):
        return JsonResponse({"message": JSON_MESSAGES[500], "errors": {}}, status=500)
    text = TEXTS[500]
    context = {"status": 500, "title": text.title, "message": text.message}
    return HttpResponse(render_to_string("error.html", context), status=500)


class ErrorPagesMiddleware:
    """Answers refusals that Django would not send to the handlers above.

    - a ``JobError`` that escapes a page view (a 409 for a job that is over) gets its
      own status and message, as the API gives it;
    - under ``DEBUG``, a 404 (no route, or a view's ``Http404``) gets the portal's page
      rather than Django's technical one with the URL map.  Sits inside
      ``CommonMiddleware`` so ``APPEND_SLASH`` still redirects ``/jobs/new``.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if settings.DEBUG:
            try:
                resolve(request.path_info, getattr(request, "urlconf", None))
            except Resolver404:
                return page_not_found(request)
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """Turn a page view's refusal into its page; anything else goes on to Django."""
        if isinstance(exception, JobError):
            return error_response(request, exception.status, exception.message)
        if isinstance(exception, Http404) and settings.DEBUG:
            return page_not_found(request, exception)
        return None
