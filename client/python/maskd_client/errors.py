"""Typed errors of maskd calls: one class per gRPC status code maskd returns, each carrying the code,
the server's message and the call's request id (the x-request-id every maskd log line of the call
carries), so that a caller can `except maskd_client.NotFound:` (re-send an evicted image) and an
operator can find the server's side of a failure.

MaskdError subclasses grpc.RpcError and keeps its `code()` / `details()` methods, so code written
against plain gRPC errors keeps working.
"""
from __future__ import annotations

from typing import Dict, Optional, Type

import grpc


class MaskdError(grpc.RpcError):
    """A maskd call that ended with a status other than OK."""

    status_code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, status_code: Optional[grpc.StatusCode] = None,
                 request_id: Optional[str] = None):
        if status_code is not None:
            self.status_code = status_code
        self.message = message
        self.request_id = request_id
        rid = f" (request id {request_id})" if request_id else ""
        super().__init__(f"{self.status_code.name}: {message}{rid}")

    # grpc.Call's accessors, as on the grpc.RpcError this replaces.
    def code(self) -> grpc.StatusCode:
        return self.status_code

    def details(self) -> str:
        return self.message


class Cancelled(MaskdError):
    status_code = grpc.StatusCode.CANCELLED


class InvalidArgument(MaskdError):
    """The request is malformed; the message names the field, the value and what was expected."""
    status_code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(MaskdError):
    status_code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(MaskdError):
    """An image_id or result_id the server no longer (or never) held: re-send the image."""
    status_code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(MaskdError):
    """A full queue, or a message over a size limit (see the README on receive limits): back off."""
    status_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(MaskdError):
    status_code = grpc.StatusCode.FAILED_PRECONDITION


class Unimplemented(MaskdError):
    status_code = grpc.StatusCode.UNIMPLEMENTED


class Internal(MaskdError):
    status_code = grpc.StatusCode.INTERNAL


class Unavailable(MaskdError):
    """Loading, shutting down or unreachable: retry, on another replica if there is one."""
    status_code = grpc.StatusCode.UNAVAILABLE


ERRORS_BY_CODE: Dict[grpc.StatusCode, Type[MaskdError]] = {
    cls.status_code: cls
    for cls in (Cancelled, InvalidArgument, DeadlineExceeded, NotFound, ResourceExhausted,
                FailedPrecondition, Unimplemented, Internal, Unavailable)
}


def error_for(status_code: grpc.StatusCode, message: str,
              request_id: Optional[str] = None) -> MaskdError:
    """The typed error of `status_code` (MaskdError itself for codes maskd does not use)."""
    cls = ERRORS_BY_CODE.get(status_code)
    if cls is None:
        return MaskdError(message, status_code, request_id)
    return cls(message, request_id=request_id)


def from_rpc_error(e: grpc.RpcError) -> MaskdError:
    """The typed error of a failed gRPC call (its code, details and x-request-id)."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    request_id = None
    if hasattr(e, "initial_metadata"):
        try:
            request_id = dict(e.initial_metadata() or ()).get("x-request-id")
        except Exception:  # noqa: BLE001 - no metadata (e.g. never connected)
            request_id = None
    details = details or ""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
        # gRPC's wording when a response is over the channel's receive limit: the server answered,
        # this client refused it.
        details += (" (the response is over this client's receive limit: raise it, "
                    "MaskdClient(max_message_bytes=...) or the channel option "
                    "grpc.max_receive_message_length, or ask for fewer prompts, multimask off or "
                    "RLE instead of PNG/logits)")
    return error_for(code, details, request_id)
