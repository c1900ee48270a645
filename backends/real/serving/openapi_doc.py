"""The server's OpenAPI document: request bodies from the pydantic models, every response it can give.

The routes read their bodies themselves (size limit, JSON checks, OpenAI-shaped 400s), so FastAPI
cannot infer the bodies; they are declared here instead, so clients and schemathesis see them.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI
from fastapi.responses import Response
from pydantic import BaseModel

_REF = "#/components/schemas/{model}"

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
    }},
}

_ERROR_TEXT = {
    400: "Invalid request (OpenAI error shape, `param` names the field)",
    401: "Missing or wrong API key",
    404: "Unknown model",
    413: "Request body above the server's limit",
    429: "Too many requests queued; retry later",
    499: "The client closed the connection before the answer was ready",
    500: "This request failed (the engine keeps serving others)",
    503: "The engine has failed or is shutting down",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI responses for these error statuses, each with the OpenAI error body."""
    return {code: {"description": _ERROR_TEXT[code], "content": {"application/json": {"schema": ERROR_SCHEMA}}}
            for code in codes}


class OpenAPIBodies:
    """Collects request-body schemas and adds their shared definitions to the document."""

    def __init__(self) -> None:
        self.defs: dict[str, Any] = {}

    def body(self, *models: type[BaseModel]) -> dict[str, Any]:
        """openapi_extra declaring the JSON request body: `models`, or any one of them."""
        refs = []
        for model in models:
            schema = model.model_json_schema(ref_template=_REF)
            self.defs.update(schema.pop("$defs", {}))
            self.defs[model.__name__] = schema
            refs.append({"$ref": _REF.format(model=model.__name__)})
        schema = refs[0] if len(refs) == 1 else {"anyOf": refs}
        return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}

    def document_route(self, app: FastAPI, path: str, models: tuple[type[BaseModel], ...],
                       responses: dict[int | str, dict[str, Any]]) -> None:
        """Declare the body and responses of a route registered elsewhere (it reads its body itself)."""
        for route in app.routes:
            if getattr(route, "path", None) == path and "POST" in getattr(route, "methods", ()):
                route.openapi_extra = self.body(*models)  # type: ignore[attr-defined]
                route.responses = {**route.responses, **responses}  # type: ignore[attr-defined]

    def document_empty_ok(self, app: FastAPI, path: str, responses: dict[int | str, dict[str, Any]]) -> None:
        """Declare that a route registered elsewhere answers 200 with an empty body (no content type)."""
        for route in app.routes:
            if getattr(route, "path", None) == path:
                route.response_class = Response  # type: ignore[attr-defined]
                route.responses = {200: {"description": "OK (empty body)"}, **responses}  # type: ignore[attr-defined]

    def install(self, app: FastAPI) -> None:
        """Make app.openapi() include the collected definitions."""
        inner: Callable[[], dict[str, Any]] = app.openapi

        def openapi() -> dict[str, Any]:
            if app.openapi_schema is None:
                doc = inner()
                doc.setdefault("components", {}).setdefault("schemas", {}).update(self.defs)
                app.openapi_schema = doc
            return app.openapi_schema

        app.openapi = openapi  # type: ignore[method-assign]


GENERATION_OK: dict[int | str, dict[str, Any]] = {200: {
    "description": "A completion, or server-sent events when `stream` is true",
    "content": {"application/json": {"schema": {"type": "object"}},
                # One JSON chunk per `data:` event, then `data: [DONE]`.
                "text/event-stream": {"schema": {}}},
}}
