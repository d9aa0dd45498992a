"""FreeToken: a local serving engine for Mixture-of-Experts models that coding agents run on."""

__version__ = "0.1.0"
