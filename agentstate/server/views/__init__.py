"""The State API's handlers, one module per family of routes (keys, runs, sessions, changes,
admin). Each handler is ``async def name(api, c) -> Response``; the route table
(``server/_routes.py``) says which route each serves and what it needs."""
