"""Renderers beyond JSON: the audit log as CSV."""

import csv
import io
import json

from rest_framework.renderers import BaseRenderer

from console.services.audit_log import EXPORT_FIELDS


class AuditCSVRenderer(BaseRenderer):
    """A list of exported audit events as CSV with a header row; `detail` as JSON text.

    Chosen by `?format=csv` (DRF's format override) or `Accept: text/csv`."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=EXPORT_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in data:
            writer.writerow({**row, "detail": json.dumps(row["detail"], sort_keys=True)})
        return out.getvalue().encode(self.charset)
