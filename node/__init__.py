"""The hastore node process and the ``hastore`` command line (root group in ``node.cli``)."""
