"""Model folders: what the trainers and the engines load (local folders only, never a
download from a model hub)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["hf_model_folder"]


def hf_model_folder(model: str | Path, owner: str, kind: str = "model") -> Path:
    """``model`` as a path, checked to be a Hugging Face ``kind`` folder (``config.json``).

    Raises:
        FileNotFoundError: no ``config.json`` there (the message names ``owner``).
    """
    path = Path(model)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{owner} model must be a Hugging Face {kind} folder with config.json, got "
            f"{str(model)!r}"
        )
    return path
