"""The two kinds of error a user's input can raise; the CLI prints each as one line (rc 2)."""


class CorpusError(ValueError):
    """Bad input data; the message names the file (and line) and is printed as one line."""


class ConfigError(ValueError):
    """A combination of options this toolkit refuses; the message names the option."""
