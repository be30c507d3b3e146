"""`llmem ui`: the local web viewer."""

from __future__ import annotations

import click


def port_option(flag: str = "--port"):
    return click.option(flag, "port", type=click.IntRange(0, 65535), default=0, show_default=True,
                        help="Port on 127.0.0.1 (0: any free port; the printed URL has the real one).")


NO_BROWSER_OPTION = click.option("--no-browser", is_flag=True, help="Print the URL only; open no browser.")


def prepare_viewer(app, port: int, *, open_browser: bool):
    """Open the store and listen on 127.0.0.1:`port`; return the server, not yet serving. Once
    it serves (and Ctrl-C stops it cleanly), it prints the one URL line with the run's token
    and opens the browser on it."""
    import secrets

    from ..ui.server import ViewerServer, bind, create_app, url_of
    from .queueing import viewer_queue

    _ = app.store  # open (and migrate) before listening: a broken store fails here, not in a page
    sock = bind(port)
    token = secrets.token_urlsafe(32)
    asgi = create_app(app, port=sock.getsockname()[1], token=token, queue=viewer_queue(app))
    address = url_of(sock, token)

    def announce() -> None:
        click.echo(address)
        if open_browser:
            import threading
            import webbrowser

            # Some browsers' launchers wait for the browser: the server must not wait with them.
            threading.Thread(target=webbrowser.open, args=(address,), daemon=True).start()

    return ViewerServer(asgi, sock, on_serving=announce)


@click.command()
@port_option()
@NO_BROWSER_OPTION
@click.pass_obj
def ui(app, port, no_browser):
    """Open the web viewer: memories, sessions, queue, dreams (127.0.0.1 only, Ctrl-C stops)."""
    prepare_viewer(app, port, open_browser=not no_browser).run()
