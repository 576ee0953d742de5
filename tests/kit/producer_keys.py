"""A model producer's keys, made by the real ``openssl`` as a producer
makes them, and the ``modelSigners`` entries of the settings that name them."""

from __future__ import annotations

import subprocess
from pathlib import Path


def openssl_key(folder: Path, name: str, curve: str = "prime256v1") -> tuple[Path, str]:
    """``folder/NAME.pem`` and its public key in PEM: EC on ``curve``, or
    RSA 2048 when ``curve`` is ``rsa``."""
    private = folder / f"{name}.pem"
    if curve == "rsa":
        made = ["openssl", "genrsa", "-out", str(private), "2048"]
        show = ["openssl", "rsa", "-in", str(private), "-pubout"]
    else:
        made = ["openssl", "ecparam", "-name", curve, "-genkey", "-noout", "-out", str(private)]
        show = ["openssl", "ec", "-in", str(private), "-pubout"]
    subprocess.run(made, check=True, capture_output=True)
    return private, subprocess.run(show, check=True, capture_output=True, text=True).stdout


def signers_yaml(*signers: tuple[str, str, list[str] | None]) -> str:
    """``  modelSigners:`` with one entry per (name, public key, models or
    None for the default), as it sits under a settings file's ``spec:``."""
    text = "  modelSigners:\n"
    for name, pem, models in signers:
        text += f"    - name: {name}\n      publicKey: |\n"
        text += "".join(f"        {line}\n" for line in pem.strip().splitlines())
        if models is not None:
            text += f"      models: [{', '.join(repr(m) for m in models)}]\n"
    return text
