"""Local development and the demo: everything embedded, DEBUG off unless DEBUG=1 (from base).

With DEBUG off, errors are the short pages of templates/400.html ... 500.html and the details go
to the log only: the demo is reachable by every logged-in viewer, who must not see tracebacks.
Set DEBUG=1 in the environment for Django's debug pages while developing.
"""

from web.settings import base, inherit

inherit(globals(), base)
