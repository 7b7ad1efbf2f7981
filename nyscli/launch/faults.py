"""Faults turned into one line: a user's mistake, a disk fault or Hydra's own error, each said
as what went wrong and what to type instead, never a traceback."""

from __future__ import annotations

import re

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf.errors import OmegaConfBaseException

from nyscli.errors import UserInputError, describe_os_error
from nyscli.overrides import override_key

# AttentionConfigError and DataError are UserInputErrors too.
USER_ERRORS = (UserInputError, HydraException, OmegaConfBaseException)
# The optional Hydra launcher plugins behind conf/cluster/ presets: launcher -> pip package.
LAUNCHER_PACKAGES = {
    "joblib": "hydra-joblib-launcher",
    "submitit_local": "hydra-submitit-launcher",
    "submitit_slurm": "hydra-submitit-launcher",
}


class Abort(BaseException):
    """Leaves Hydra's job runner untouched (it only catches Exception) with an exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class JobFailed(Abort):
    """A job of a sweep failed under ``fail_fast``: the sweep stops there (exit code 1). An
    Abort, so Hydra's job runner lets it through and no later job starts."""

    def __init__(self, message: str, job: int, folder: str) -> None:
        super().__init__(message, 1)
        self.job = job
        self.folder = folder


def one_line(error: BaseException) -> str:
    """The error's message, and its cause's, on one line."""
    # Hydra appends its whole config search path to missing-config errors: noise for users.
    text = " ".join(str(error).split("Config search path")[0].split())
    cause = error.__cause__
    if cause is not None and str(cause).strip():
        first = str(cause).strip().splitlines()[0].strip()
        if first not in text:
            text += f" ({first})"
    return text


# Hydra's advice for an unknown attention option (+attention.x=...) only leads to our own
# refusal of the option: say what it is instead.
_UNKNOWN_OPTION = re.compile(r"Could not override '(attention\.[\w.]+)'.*not in struct")


def _attention_hint(text: str) -> str:
    found = _UNKNOWN_OPTION.search(text)
    if found is None:
        return text
    return (
        f"{found.group(1)} is not an option of the chosen attention (of none in a sweep); "
        "--cfg job shows the options it has"
    )


def fault_line(error: BaseException) -> str:
    """One line for a user error, or for an OS fault (file, reason, what to do)."""
    # Hydra's MissingConfigException is an IOError too, but a user error, not a disk fault.
    if isinstance(error, OSError) and not isinstance(error, USER_ERRORS):
        return describe_os_error(error)
    return _attention_hint(one_line(error))


def as_typed(message: str, typed: dict[str, str]) -> str:
    """``message`` with each override a typed option became (``seq_lens=[0]``) said as the user
    typed it (``--seq-len 0``)."""
    for made, given in typed.items():
        message = re.sub(rf"(?<![\w.]){re.escape(made)}(?![\w\]])", given, message)
    return message


_GRAMMAR_ERRORS = ("mismatched input", "token recognition error", "no viable alternative",
                   "extraneous input", "missing EQUAL", "LexerNoViableAltException")  # fmt: skip


def _first_unparsable(overrides: list[str]) -> int | None:
    parser = OverridesParser.create()
    for index, override in enumerate(overrides):
        try:
            parser.parse_override(override)
        except HydraException:
            return index
    return None


def parse_hint(message: str, overrides: list[str]) -> str:
    """Hydra's override-grammar error, said as what to type: which argument it could not
    parse, and how to quote a path with spaces (the shell splits it), with ``(),[]{}=``
    (Hydra's grammar reads them) or with letters outside ASCII (its grammar reads none
    unquoted)."""
    if not any(marker in message for marker in _GRAMMAR_ERRORS):
        return message
    index = _first_unparsable(overrides)
    if index is None:
        return message
    override = overrides[index]
    if "=" not in override and index and "=" in overrides[index - 1]:
        whole = f"{overrides[index - 1]} {override}"
        return (
            f"cannot read the argument '{override}' (no key=value): if it belongs to the value "
            f'before it, quote the whole override for your shell: "{whole}"'
        )
    key, _, value = override.partition("=")
    foreign = ", ".join([c for c in dict.fromkeys(override) if not c.isascii()][:3])
    if foreign and not key.isascii():
        return (
            f"cannot read {override}: a key is written in ASCII letters, digits, _ and . "
            f"(not {foreign}); --cfg job shows the keys"
        )
    if foreign:
        return (
            f"cannot read {override}: Hydra's grammar reads no character outside ASCII "
            f"({foreign}) in an unquoted value; quote the value inside the shell's quotes: "
            f"\"{key}='{value}'\""
        )
    return (
        f"cannot read {override}: Hydra's grammar reads ( ) [ ] {{ }} , = and quotes in a "
        f"value; quote the value inside the shell's quotes: \"{key}='{value}'\""
    )


def refusal_line(error: BaseException, overrides: list[str], typed: dict[str, str]) -> str:
    """The one line a launch refused before it started prints for ``error``: the launcher
    plugin to install, or the fault with a quoting hint for an unparsable override, said with
    the typed options as typed."""
    message = missing_launcher(error, overrides) or parse_hint(fault_line(error), overrides)
    return as_typed(message, typed)


def missing_launcher(error: BaseException, overrides: list[str]) -> str | None:
    """The one-line install hint when a cluster preset's launcher plugin is not installed."""
    if not isinstance(error, MissingConfigException):
        return None
    missing = str(error.missing_cfg_file or "")
    launcher = missing.removeprefix("hydra/launcher/")
    if launcher == missing or launcher not in LAUNCHER_PACKAGES:
        return None
    package = LAUNCHER_PACKAGES[launcher]
    # The default preset (local) needs no plugin: the culprit is the one given, if any.
    presets = [o.lstrip("+~") for o in overrides if override_key(o) == "cluster"]
    choice = presets[-1] if presets else f"hydra/launcher={launcher}"
    return (
        f"{choice} needs the Hydra launcher plugin {package}, which is not installed: "
        f"pip install {package}"
    )
