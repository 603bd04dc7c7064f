"""Errors in Kobold's shape, `{"detail": {"msg", "type"}}` (KoboldAI's; SillyTavern shows `detail.msg`),
plus `param`, the field at fault, with the status our OpenAI routes would give."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from actors.http.errors import ApiError


def kobold_error_body(error: ApiError) -> dict[str, Any]:
    return {"detail": {"msg": error.message, "type": error.code or "error", "param": error.param}}


def kobold_error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(kobold_error_body(error), status_code=error.status, headers=error.headers)
