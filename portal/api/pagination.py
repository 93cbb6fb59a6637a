"""Page-number pagination with a client-chosen page size (bounded)."""

from rest_framework.pagination import PageNumberPagination


class StandardPagination(PageNumberPagination):
    """``?page=N&page_size=M`` (M at most 200, default 50)."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200
