"""Where codectx keeps its caches: $CODECTX_HOME, else ~/.cache/codectx."""
from __future__ import annotations

import os
from pathlib import Path


def codectx_home() -> Path:
    """The cache root (not created here)."""
    env = os.environ.get("CODECTX_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "codectx"


def prepare_home() -> list[str]:
    """Creates the home folder private to the user (mode 0700) when it is missing, and says
    what is wrong with an existing one that other users can write or read.

    The home holds token caches (source text in token form), checkpoints of the model's
    state over the user's repositories and converted models the engine loads: other users
    must not read the first two, and must not be able to plant any of them.

    Returns:
        One message per problem (empty when the folder is private); the caller logs them.
    """
    home = codectx_home()
    try:
        home.parent.mkdir(parents=True, exist_ok=True)
        home.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as err:
        return [f"cannot create the cache folder {home}: {err}"]
    try:
        st = os.stat(home)
    except OSError as err:
        return [f"cannot read the cache folder {home}: {err}"]
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return [f"the cache folder {home} belongs to another user (uid {st.st_uid}); codectx trusts the "
                "checkpoints and models in it as if they were yours: set CODECTX_HOME to a folder of your own"]
    if st.st_mode & 0o022:
        return [f"the cache folder {home} is writable by other users (mode {st.st_mode & 0o777:o}); they could "
                f"plant checkpoints or models: run `chmod 700 {home}`"]
    if st.st_mode & 0o044:
        return [f"the cache folder {home} is readable by other users (mode {st.st_mode & 0o777:o}); cached "
                f"tokens and checkpoints of your repositories are visible to them: run `chmod 700 {home}`"]
    return []
