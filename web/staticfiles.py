"""The console's static files storage: hashed names once `collectstatic` has run, plain names
before."""

from whitenoise.storage import CompressedManifestStaticFilesStorage


class ManifestOnceCollected(CompressedManifestStaticFilesStorage):
    """WhiteNoise's manifest storage (`collectstatic` writes each file also under a name with its
    content hash, and pages link that name) that links the plain names while nothing has been
    collected.

    The parent refuses to render a page linking a static file it finds in no manifest ("Missing
    staticfiles manifest entry for 'backstop.css'"), so from a fresh clone every page rendered
    with the default settings failed (`manage.py fleet_sim` timing the pages included) until
    `bin/demo` had collected once. Once a manifest exists this is the parent again: a file
    missing from it is an error, not a plain link.
    """

    def stored_name(self, name):
        """The hashed name from the manifest; `name` itself when no manifest was collected."""
        if not self.hashed_files:
            return name
        return super().stored_name(name)
