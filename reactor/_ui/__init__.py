"""``reactor ui``: a web dashboard of a database, served by uvicorn (the ``ui`` extra).

``app`` holds the routes and the JSON API, ``feed`` the change feed (Server-Sent
Events), ``changes`` how a change is shown (values as JSON text, an update's JSON
Patch), ``guard`` who may reach the page and who may write, ``server`` the socket and
uvicorn. The page itself (HTML, JS, CSS) is in ``static/``: nothing is loaded from
elsewhere, so it works offline.
"""
