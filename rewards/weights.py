"""Finding reward-model weights on local disk, never downloading.

Weights come from an explicit local path or from the Hugging Face cache
(``HF_HOME``, default ``~/.cache/huggingface``), looked up without network
access. A missing file is a :class:`MissingWeightsError` that says what to
download and where to put it.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import snapshot_download, try_to_load_from_cache


class MissingWeightsError(FileNotFoundError):
    """Reward weights are not on this machine."""


def weights_file(path: str | Path | None, repo_id: str, filename: str, reward: str) -> Path:
    """``path`` if given (must exist), else ``repo_id/filename`` from the HF cache."""
    if path is not None:
        path = Path(path).expanduser()
        if not path.is_file():
            raise MissingWeightsError(f"reward {reward!r}: weights file {path} does not exist")
        return path
    cached = try_to_load_from_cache(repo_id, filename)
    if isinstance(cached, str):
        return Path(cached)
    raise MissingWeightsError(
        f"reward {reward!r} needs {filename} from the Hugging Face repo {repo_id}, which is not in the local cache. "
        f"Download it on a machine with access (`huggingface-cli download {repo_id} {filename}`, then copy "
        f"~/.cache/huggingface over) or pass its local path."
    )


def weights_directory(path: str | Path | None, repo_id: str, reward: str) -> Path:
    """``path`` if given (a ``from_pretrained`` directory), else the cached snapshot of ``repo_id``."""
    if path is not None:
        path = Path(path).expanduser()
        if not path.is_dir():
            raise MissingWeightsError(f"reward {reward!r}: model directory {path} does not exist")
        return path
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception as error:
        raise MissingWeightsError(
            f"reward {reward!r} needs the Hugging Face repo {repo_id}, which is not in the local cache. "
            f"Download it on a machine with access (`huggingface-cli download {repo_id}`) or pass a local directory."
        ) from error


def status(path: str | Path | None, repo_id: str, filename: str | None = None) -> str:
    """``"present: <path>"`` or ``"missing: <what>"`` for ``flowrl rewards list``."""
    try:
        if filename is None:
            found = weights_directory(path, repo_id, "?")
        else:
            found = weights_file(path, repo_id, filename, "?")
    except MissingWeightsError:
        return f"missing: {repo_id}" + (f"/{filename}" if filename else "")
    return f"present: {found}"
