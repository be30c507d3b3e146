"""`llmem ui`: a local web viewer over the store, served on 127.0.0.1 with a per-run token.

server.py builds the app and serves it, security.py guards every request, web.py holds what
pages share, pages/ has one module per page (its routes and its place in the navigation),
templates/ and static/ everything the browser gets.
"""
