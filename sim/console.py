"""What the ``kvsim`` command prints: whole lines on streams that parallel jobs share
(:func:`write_line`), the one-line error for a failure of the machine rather than of kvsim
(:func:`resource_error`) and for an override Hydra cannot compose (:func:`hydra_error`), and how
a command ends after Ctrl-C or SIGTERM (:func:`exit_after_interrupt`). Imports nothing of kvsim."""

from __future__ import annotations

import errno
import os
import sys
from typing import NoReturn


def exit_after_interrupt(status: int) -> NoReturn:
    """End the process with exit ``status`` after Ctrl-C or SIGTERM was caught and reported:
    logging's handlers are flushed and closed, stdout and stderr flushed, then ``os._exit``.

    A normal exit (``sys.exit``) is not enough there: when the interrupt arrived while code that
    ``exec()`` ran from a string was running (dataclasses build their methods that way while
    modules import), CPython keeps a flag that an interrupt went unhandled, and a program started
    as ``python -m MODULE`` then ends by SIGINT (status -2) instead of its exit status, although
    it caught the interrupt. Only for a process that is ending because of an interrupt:
    ``os._exit`` skips other ``atexit`` handlers."""
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # (a closed pipe or stream: nothing more can be said)
            pass
    os._exit(status)


def write_line(stream, text: str) -> None:
    """Write ``text`` and its newline to ``stream`` in one write, flushed before and after.

    A sweep's parallel jobs (the joblib launcher's workers) share one stdout and stderr:
    ``print`` writes the text and the newline apart, so two jobs' lines could join on one line
    (``results: /a/0results: /a/1``). One write of a line under the pipe's atomic size
    (PIPE_BUF, 4,096 bytes on Linux) reaches the pipe whole."""
    stream.flush()
    stream.write(text + "\n")
    stream.flush()


# write errors that are the machine's, not kvsim's: one line naming the file, no traceback
_RESOURCE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def resource_error(e: BaseException) -> str | None:
    """The one-line error for an exception that is the machine's, not kvsim's: out of memory
    (MemoryError), a full disk or quota (ENOSPC, EDQUOT), the file size limit (EFBIG, ``ulimit
    -f``) or a read-only filesystem (EROFS), naming the file and what to do; None for any
    other exception."""
    if isinstance(e, MemoryError):
        return ("out of memory (MemoryError): the simulation needed more memory than this "
                "machine had free; expected more free memory: run fewer jobs at once "
                "(hydra.launcher.n_jobs), a shorter trace (trace.max_requests) or a smaller "
                "pool (cache.num_gpu_blocks)")
    if isinstance(e, OSError) and e.errno in _RESOURCE_ERRNOS:
        what = {errno.ENOSPC: "no space left on the device",
                errno.EDQUOT: "the disk quota is used up",
                errno.EFBIG: "the file size limit (ulimit -f) is reached",
                errno.EROFS: "the filesystem is read-only"}[e.errno]
        where = f" writing {e.filename}" if e.filename else ""
        return (f"{what}{where} ({errno.errorcode[e.errno]}: {e.strerror}); expected room "
                f"for the results: free space (or pick another output.dir), then run the "
                f"same command with output.skip_completed=true")
    return None



def _plain_scalar(value: str) -> bool:
    """Whether an override's ``value`` is one Hydra reads as a number, a boolean or null."""
    v = value.strip()
    if v.lower() in ("true", "false", "null", ""):
        return True
    try:
        float(v)
    except ValueError:
        return False
    return True

def hydra_error(e: BaseException) -> str | None:
    """The one-line error for an exception Hydra raises composing a config from the command
    line (its own message is several lines and exit status 1), naming the override and what was
    expected; None for any other exception. Covered: an option a config group does not have
    (``model=qwen3-8b``: the closest option and the list), a key the typed config does not have
    (``trace.max_request=1``: the closest field; Hydra's hint to append it with ``+`` is not
    what a typo wants), and a value that cannot be its field's type (``seed=abc``, ``seed=null``
    for a field that takes no null), an argument that is no ``KEY=VALUE`` override
    (``trace.max_requests 200``) and a config group given a number, a boolean or null
    (``policy=5``: the arguments of ``sys.argv`` that set a group so are named)."""
    import dataclasses
    import difflib

    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    if isinstance(e, OverrideParseException):
        text = str(e)
        why = "it has no '='" if "missing EQUAL" in text else "Hydra's parser: " + next(
            (ln.strip() for ln in text.splitlines()[1:] if ln.strip().strip("^")
             and not ln.startswith("See ")), text.splitlines()[0].strip())
        return (f"{e.override}: not an override Hydra can parse ({why}); expected KEY=VALUE, "
                f"e.g. trace.max_requests=200")
    if isinstance(e, ValueError) and str(e).startswith("Config group override must be a string"):
        got = {"int": "a number", "float": "a number", "bool": "true/false",
               "NoneType": "null"}.get(str(e).rsplit(" ", 1)[-1], "that value")
        import sys

        given = [a for a in sys.argv[1:] if "=" in a and not a.startswith("-")
                 and "." not in a.split("=", 1)[0]
                 and any(_plain_scalar(v) for v in a.split("=", 1)[1].split(","))]
        where = ", ".join(given) if given else "a config group's override"
        return (f"{where}: a config group takes an option's name, not {got}; expected "
                f"GROUP=OPTION, e.g. policy=snapkv (`kvsim --help` lists each group's options)")
    if isinstance(e, MissingConfigException) and e.options and e.missing_cfg_file \
            and "/" in e.missing_cfg_file:
        group, _, option = e.missing_cfg_file.rpartition("/")
        options = sorted(e.options)
        close = difflib.get_close_matches(option, options, n=1)
        hint = f"did you mean {group}={close[0]}? " if close else ""
        return (f"{group}={option}: no option {option!r} in config group '{group}'; {hint}"
                f"(options: {', '.join(options)})")
    if not isinstance(e, ConfigCompositionException):
        return None
    cause = e.__cause__
    text = str(e).strip()
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and \
            text.startswith("Could not override '"):
        key = text[len("Could not override '"):].split("'", 1)[0]
        where, _, part = key.rpartition(".")
        schema = cause.object_type if isinstance(cause.object_type, type) else None
        fields = [f.name for f in dataclasses.fields(schema)] \
            if schema is not None and dataclasses.is_dataclass(schema) else []
        inner = str(getattr(cause, "key", "") or "")
        if inner and inner != part and schema is not None:
            # a field inside the override's list or dict value (tiers.levels=[{...}])
            close = difflib.get_close_matches(inner, fields, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            return (f"{key}: unknown key '{inner}' in its value: {schema.__name__} has no field "
                    f"'{inner}'{hint} (fields: {', '.join(fields)})")
        close = difflib.get_close_matches(part, fields, n=1)
        hint = f"; did you mean {'.'.join([where, close[0]] if where else close)}?" if close else ""
        return (f"unknown config key '{key}': {where or 'the config'} has no field '{part}'"
                f"{hint} (kvsim --cfg job prints every key)")
    if isinstance(cause, ValidationError) and text.startswith("Error merging override "):
        given = text[len("Error merging override "):].splitlines()[0]
        why = (cause.msg or str(cause)).strip().splitlines()[0]
        entry = _list_entry_error(given, cause)
        full = str(getattr(cause, "full_key", "") or "")
        if entry is not None:
            given, why = entry
        elif "[" in full and given.startswith(full.split("[", 1)[0] + "="):
            given = full  # (an entry of the list that is not a record: tiers.levels=[5])
        want = _wanted(why)
        return f"{given}: expected {want}" if want else f"{given}: {why}"
    return None


def _wanted(why: str) -> str | None:
    """What OmegaConf's validation message ``why`` says was expected, in a few words; None
    when it is not one of those."""
    import re

    m = re.search(r"is not a subclass of (\w+)", why)
    return ("an integer" if why.endswith("to Integer") else
            "a number" if why.endswith("to Float") else
            "true or false" if "is not a valid bool" in why or why.endswith("to Boolean") else
            "a string" if why.startswith("Cannot convert") and "to string" in why else
            "a list" if "is not a ListConfig, list or tuple" in why else
            f"a {m.group(1)} record ({{field: value, ...}})" if m else
            "a value (this key takes no null)" if why.endswith("is not Optional") else None)


def _list_entry_error(given: str, cause) -> tuple[str, str] | None:
    """For the override ``given`` (``key=[{...}, ...]``) that OmegaConf rejected with
    ``cause`` (a ValidationError of a field of one of the list's records, which names the
    field but not the entry), the entry and field it names, ``key[i].field=value``, and the
    field's own message (found by merging each entry alone into its record type); None when
    ``given`` is not such an override."""
    import dataclasses

    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    schema = getattr(cause, "object_type", None)
    field = str(getattr(cause, "key", "") or "")
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)) or not field:
        return None
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        o = OverridesParser.create().parse_override(given)
        entries = o.value()
    except Exception:  # noqa: BLE001 - (Hydra's grammar errors have several types)
        return None
    if not isinstance(entries, list):
        return None
    key = o.key_or_group
    for i, item in enumerate(entries):
        if not isinstance(item, dict):
            continue
        try:
            OmegaConf.merge(OmegaConf.structured(schema), item)
        except OmegaConfBaseException as e:
            name = str(getattr(e, "key", "") or field)
            value = item.get(name, "?")
            return (f"{key}[{i}].{name}={value}",
                    (getattr(e, "msg", None) or str(e)).strip().splitlines()[0])
    return None
