"""Errors as OpenAI's error JSON, ``{"error": {"message", "type", "param", "code"}}``,
with the status code OpenAI's clients expect. Bad input is never a 500."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from inference.errors import InferdeskError, InvalidInputError, OutOfMemoryError
from inference.server.scheduler import QueueFullError, WorkerStoppedError


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None):
        # A message may quote what the client sent; it must encode, whatever that was.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = (
            status, message, type_, code, param)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"Retry-After": "1"} if self.status in (429, 503) else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def from_engine(e: BaseException) -> APIError:
    """What an engine error means to a client."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, QueueFullError):
        return APIError(429, str(e), "rate_limit_error", "queue_full")
    if isinstance(e, WorkerStoppedError):
        return APIError(503, str(e), "server_error", "worker_stopped")
    if isinstance(e, (OutOfMemoryError, MemoryError)):
        return APIError(503, str(e) or "Out of memory.", "server_error", "out_of_memory")
    if isinstance(e, InvalidInputError):
        return APIError(400, str(e))
    if isinstance(e, InferdeskError):
        return APIError(400, str(e))
    return APIError(500, f"Internal error: {type(e).__name__}: {e}", "server_error")


def _validation_message(e: RequestValidationError) -> tuple[str, str | None]:
    errs = e.errors()
    if not errs:
        return "The request body is invalid.", None
    first = errs[0]
    if first.get("type") == "json_invalid":
        return "The request body is not valid JSON.", None
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    return (f"Invalid '{param}': {first.get('msg')}." if param
            else f"Invalid request body: {first.get('msg')}."), param


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api(_: Request, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(InferdeskError)
    async def _engine(_: Request, e: InferdeskError) -> JSONResponse:
        return from_engine(e).response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        msg, param = _validation_message(e)
        return APIError(400, msg, param=param).response()

    @app.exception_handler(Exception)
    async def _bug(_: Request, e: Exception) -> JSONResponse:
        return from_engine(e).response()  # OpenAI's error JSON, even for a 500

    @app.exception_handler(HTTPException)
    async def _http(_: Request, e: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        msg = {404: "No such endpoint.", 405: "Method not allowed on this endpoint."}.get(
            e.status_code, str(e.detail))
        return APIError(e.status_code, msg, code=code).response()
