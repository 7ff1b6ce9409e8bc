"""The Hydra configs of the ``hybrid`` command, installed as the package ``hybrid.configs``."""
