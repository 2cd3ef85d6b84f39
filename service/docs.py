"""GET /docs: Swagger UI from the package's own files (PyPI ``swagger-ui-bundle-v2``), so it works offline."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

docs_router = APIRouter(include_in_schema=False)
ASSETS = "/static/swagger-ui"


def swagger_ui_dir() -> str:
    """Swagger UI 5's dist files (Apache-2.0, its LICENSE in the package's metadata)."""
    from swagger_ui_bundle import swagger_ui_path

    return str(swagger_ui_path)


@docs_router.get("/docs")
def docs(request: Request) -> HTMLResponse:
    """Swagger UI for /openapi.json, every asset served by this server."""
    root = request.scope.get("root_path", "")
    return get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS}/favicon-32x32.png",
    )
