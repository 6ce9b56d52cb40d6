"""The three ways a command can fail, each with its exit code.

The CLI turns these into one line on stderr and the code; nothing else in the
package exits or prints.
"""


class PrecisionLabError(Exception):
    exit_code = 1


class UsageError(PrecisionLabError):
    """Bad input: unknown dtype, n <= 0, bad shape or file. Exit 2."""

    exit_code = 2


class RunError(PrecisionLabError):
    """A run that started and failed. Exit 1."""

    exit_code = 1


class NoDeviceError(PrecisionLabError):
    """--device cuda where there is no usable GPU. Exit 3."""

    exit_code = 3
