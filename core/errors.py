"""The one exception a user should ever see: the CLI prints its message on one line and exits non-zero."""


class PipelineError(Exception):
    """Bad input or a failed stage. The message names the file or value and what to do."""
