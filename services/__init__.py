"""The three separately deployed services of a sink replica: `mint`, `write`, `append`.

Each is started with `python -m services.<name>` and configured by `mvsink.io.config`.
"""
