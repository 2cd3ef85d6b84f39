"""GET /docs: Swagger UI from the package's own files (PyPI ``swagger-ui-bundle-v2``), so it works offline.

Without that package (an image that installed the service's wheels by hand and left it out) the
service still serves everything else: /docs answers 503 and says what to install.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, PlainTextResponse

docs_router = APIRouter(include_in_schema=False)
ASSETS = "/static/swagger-ui"


MISSING = ("Swagger UI's files are not installed here (pip install swagger-ui-bundle-v2); "
           "the API's schema is at /openapi.json\n")


def swagger_ui_dir() -> str | None:
    """Swagger UI 5's dist files (Apache-2.0, its LICENSE in the package's metadata); None when not installed."""
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:
        return None
    return str(swagger_ui_path)


@docs_router.get("/docs", response_model=None)
def docs(request: Request) -> HTMLResponse | PlainTextResponse:
    """Swagger UI for /openapi.json, every asset served by this server."""
    if not getattr(request.app.state, "swagger_ui", True):
        return PlainTextResponse(MISSING, status_code=503)
    root = request.scope.get("root_path", "")
    return get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS}/favicon-32x32.png",
    )
