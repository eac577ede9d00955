"""The job's shared token: where the master and its clients take it from, and what one may be.

One definition for both sides, so that a token the master starts with is one every client
can send. A token is one line of printable ASCII (what gRPC metadata can carry), taken from,
in this order: the value given in code (`Client(token=...)`), the file a command's
`--token-file` names, the file CHUNKMASTER_TOKEN_FILE names, or CHUNKMASTER_TOKEN itself;
the two variables together are refused (which would win is a guess). Errors never quote a
token, nor a value that may have been one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "TOKEN_ENV",
    "TOKEN_FILE_ENV",
    "check_token",
    "environment_token",
    "given_token",
    "read_token",
]

#: The variable that holds the token itself.
TOKEN_ENV = "CHUNKMASTER_TOKEN"
#: The variable that names the file holding the token (what the Slurm recipe exports).
TOKEN_FILE_ENV = "CHUNKMASTER_TOKEN_FILE"

#: How a person gives a client the token, for the errors that ask for one.
HOW_TO_GIVE = f"token= (Client), --token-file (commands), {TOKEN_FILE_ENV} or {TOKEN_ENV}"


def check_token(token: str) -> str | None:
    """What makes `token` unsendable (in words, never quoting it), or None if it is fine."""
    if not token:
        return "is empty"
    for char in token:
        if char in "\r\n":
            return "holds a line break"
        if not char.isascii():
            return "holds a non-ASCII character"
        if not char.isprintable():
            return "holds a control character"
    return None


def read_token(path: str) -> str:
    """The token held in the file `path` (surrounding whitespace dropped); a ValueError
    saying what is wrong otherwise. A path that names no file is not quoted: it may be
    the token itself, given where its file was expected."""
    if not os.path.lexists(path):
        raise ValueError(
            f"the value given ({len(path)} characters, not shown in case it is the token) is "
            "not a file path that exists: give the path of a file holding the token, never "
            "the token itself"
        )
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the token file {path}: {exc.strerror}") from None
    token = data.decode("ascii", errors="replace").strip()  # a non-ASCII byte: U+FFFD
    problem = check_token(token)
    if problem is not None:
        raise ValueError(f"the token file {path} {problem}{_RULE}")
    return token


def environment_token(environ: Mapping[str, str] | None = None) -> str | None:
    """The token the environment gives (the file CHUNKMASTER_TOKEN_FILE names, or
    CHUNKMASTER_TOKEN), None if neither is set; a ValueError naming the variable at fault."""
    env = os.environ if environ is None else environ
    path, token = env.get(TOKEN_FILE_ENV) or None, env.get(TOKEN_ENV) or None
    if path is not None and token is not None:
        raise ValueError(f"{TOKEN_FILE_ENV} and {TOKEN_ENV}: give the token one way, not both")
    if path is not None:
        try:
            return read_token(path)
        except ValueError as exc:
            raise ValueError(f"{TOKEN_FILE_ENV}: {exc}") from None
    if token is None:
        return None
    try:
        return given_token(token.strip())
    except ValueError as exc:
        raise ValueError(f"{TOKEN_ENV}: {exc}") from None


def given_token(token: str) -> str:
    """`token`, given as a value (in code, or a variable), if it is one; a ValueError saying
    what is wrong if not."""
    problem = check_token(token)
    if problem is not None:
        raise ValueError(f"the token given {problem}{_RULE}")
    return token


_RULE = ": a token is one line of printable ASCII characters (what gRPC metadata carries)"
