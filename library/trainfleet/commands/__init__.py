"""The commands besides Lightning's (``fit``, ``validate``, ``test``, ``predict``: ``cli.py``), one per file, each
with a ``main(argv) -> exit code``; ``trainfleet/main.py`` is their one entry point. Nothing else imports this
package."""
