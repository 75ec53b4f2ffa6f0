"""inferq's one exception tree; only the API's error handlers (api/errors.py) map it to HTTP.

AppError
 ├── ConfigError        bad settings or model config (a startup problem)
 ├── NotFound           unknown model or job, or an expired one
 ├── InvalidInput       the client sent something unusable
 │    └── UnsupportedMedia  not a type this model takes
 ├── PayloadTooLarge    the body is over the configured limit
 ├── Conflict           the job is in a state that forbids the operation
 ├── QueueFull          the model's queue is at its limit; retry later
 │    └── QuotaExceeded  the caller's tenant is over a quota; retry after the time it names
 ├── Unauthorized       an API key is needed and missing or wrong
 ├── Forbidden          the key is good, but only an operator's may do this
 └── Unavailable        Redis cannot be reached
"""

from __future__ import annotations


class AppError(Exception):
    """Base of every error inferq raises on purpose."""

    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(AppError):
    code = "config_error"


# sysexits' EX_CONFIG: a process that cannot work as configured exits with it, and a restart would not
# change that (the supervisor does not restart it).
EXIT_CONFIG = 78


class NotFound(AppError):
    code = "not_found"


class InvalidInput(AppError):
    code = "invalid_input"


class UnsupportedMedia(InvalidInput):
    code = "unsupported_media_type"


class PayloadTooLarge(AppError):
    code = "payload_too_large"


class Conflict(AppError):
    code = "conflict"


class QueueFull(AppError):
    code = "queue_full"


class QuotaExceeded(QueueFull):
    code = "quota_exceeded"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(retry_after_s)}


class Unauthorized(AppError):
    code = "unauthorized"


class Forbidden(AppError):
    code = "forbidden"


class Unavailable(AppError):
    code = "unavailable"
