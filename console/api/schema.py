"""OpenAPI additions: every error a client can get, in the one JSON envelope the API uses.

drf-spectacular documents the success responses it infers from the views; the errors come from
the exception handler (console.api.exceptions), the permission classes, the 404 handler and the
web server in front. `document_errors` (a postprocessing hook) adds them to every operation, so a
client, or a fuzzer checking responses against the schema, knows each status code it may see.
"""

ERROR_SCHEMA = {
    "type": "object",
    "description": 'Every API error: {"error": {"status", "code", "detail"}}.',
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["status", "code", "detail"],
            "properties": {
                "status": {"type": "integer", "description": "the HTTP status code"},
                "code": {"type": "string", "description": "e.g. invalid, not_authenticated"},
                "detail": {
                    "description": "a message, or {field: [messages]} for invalid input",
                    "oneOf": [
                        {"type": "string"},
                        {"type": "object", "additionalProperties": True},
                        {"type": "array", "items": {}},
                    ],
                },
            },
        }
    },
}

ERRORS = {
    "400": "Invalid input; the detail names each field.",
    "401": "No credentials, or a token or session that is not valid.",
    "403": "Authenticated, but the role does not allow this.",
    "404": "No such object.",
    "413": "The request body is larger than the server accepts.",
    "415": "A request body in a media type the endpoint does not parse.",
    "429": "Too many requests from this user (API_THROTTLE_USER) or, unauthenticated, this "
    "address (API_THROTTLE_ANON); Retry-After says when to try again.",
}
# Refusals that only some operations give: (method, path) -> {status: description}.
SPECIFIC_ERRORS = {
    ("post", "/api/auth/token/"): {"429": "Too many failed logins for this user or address."},
    ("post", "/api/jobs/{id}/stop/"): {"409": "The job cannot be stopped in its current state."},
    ("post", "/api/jobs/{id}/restart/"): {"409": "The job is neither failed nor stopped."},
    ("post", "/api/jobs/{job_pk}/faults/"): {
        "409": "The job is not running.",
        "429": "More than FAULT_RATE_LIMIT_PER_MINUTE faults for this job in the last minute.",
    },
}
BODY_METHODS = {"post", "put", "patch"}


def _error_response(description: str) -> dict:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def document_errors(result, generator, request, public):
    """Add the Error component and the error responses of every operation to the schema."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            codes = dict(ERRORS)
            if method not in BODY_METHODS:
                codes.pop("413")
                codes.pop("415")
            if path == "/api/auth/token/":
                # Anyone may ask for a token: no role check, nothing to look up.
                codes.pop("403")
                codes.pop("404")
            codes.update(SPECIFIC_ERRORS.get((method, path), {}))
            for status, description in codes.items():
                responses.setdefault(status, _error_response(description))
    return result
