"""The local web viewer: leaderboard, task and run pages (each with a JSON twin), charts, static export.

``Site`` renders pages from the run records and bench results; ``serve`` puts it behind the stdlib
``ThreadingHTTPServer`` on 127.0.0.1; ``export_site`` writes the same pages as a static folder.
"""

from .server import export_site, serve
from .site import Page, Site

__all__ = ["Page", "Site", "export_site", "serve"]
