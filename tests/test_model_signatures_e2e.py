"""Model signatures end to end with real parts: signatures made by the real
``model-signing`` package (``python -m model_signing sign key``) with EC
keys made by ``openssl``, as a model producer makes them; the artifacts and
signatures served by Debian's nginx; one real ``reconciler agent`` per
case; a bare repository and the in-process daemon.

A signed model rollout completes, and every node says who vouched for its
files. Each bad signature ends ``stage_failed`` with ``signature_invalid``,
no apply is ever sent, and the runtime's config stays byte for byte as it
was. A signed GGUF model rolled out live is loaded from the verified model
directory by a real ``llama-server`` (llama.cpp, built by `make
llama-server`) that the shipped after-apply script restarts.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli.llama_runtime import LlamaNode, free_port
from reconciler.cli.main import main as cli
from reconciler.protocol.model_ids import layout_pairs, manifest_bytes, model_id
from reconciler.spec.artifacts import Artifact, ModelSigner
from reconciler.spec.safe_yaml import load_yaml
from tests.kit.agents import AgentThread
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import AgentFleet
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.llama import (
    Models,
    complete,
    file_digest,
    llama_server_binary,
    model_artifact,
    node_config,
)
from tests.kit.nginx import NginxServer
from tests.kit.producer_keys import openssl_key, signers_yaml
from tests.test_attestations import consumer

pytestmark = pytest.mark.slow

OLD = b"provider: vllm\nmodel: old\nprofile: default\n"
WEIGHTS = hashlib.sha256(b"signed weights").digest() * 8192  # 256 KiB
TOKENIZER = b'{"tokens": ["a", "b"]}\n'
FILES = {"model.gguf": WEIGHTS, "tokenizer.json": TOKENIZER}

# case -> (model, how the signature is made, what the stage error says)
CASES: dict[str, tuple[str, str, str]] = {
    "good": ("llama-3", "release", ""),
    "other-key": ("llama-3", "stranger", "no key of the signers covering this model verifies"),
    "not-covered": ("qwen-2", "release", "no key of the signers covering this model verifies"),
    "file-set": ("llama-3", "file-set", "artifacts not signed: tokenizer.json; signed files"),
    "digest": ("llama-3", "digest", "signed with another digest: model.gguf"),
    "truncated": ("llama-3", "truncated", "is not an OpenSSF Model Signing bundle"),
    "symlink": ("llama-3", "release", "holds a symbolic link, extra"),
}


def _sign(model: Path, key: Path, out: Path) -> None:
    """As a producer signs a release: the reference library's command."""
    subprocess.run(
        [sys.executable, "-m", "model_signing", "sign", "key", str(model),
         "--private_key", str(key), "--signature", str(out)],
        check=True,
        capture_output=True,
    )  # fmt: skip


def _model(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True)
    for path, data in files.items():
        (folder / path).write_bytes(data)
    return folder


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The files nginx serves: the model, and one signature per way of making it."""
    root = tmp_path_factory.mktemp("producer")
    release, release_pem = openssl_key(root, "release")
    stranger, _ = openssl_key(root, "stranger")
    _, lab_pem = openssl_key(root, "lab")
    served = root / "mirror"
    _model(served, FILES)
    good = _model(root / "model", FILES)
    _sign(good, release, served / "release.sig")
    _sign(good, stranger, served / "stranger.sig")
    other_set = _model(root / "other-set", {"model.gguf": WEIGHTS, "notes.txt": b"extra\n"})
    _sign(other_set, release, served / "file-set.sig")
    other_bytes = _model(root / "other-bytes", {**FILES, "model.gguf": WEIGHTS[:-1] + b"!"})
    _sign(other_bytes, release, served / "digest.sig")
    whole = (served / "release.sig").read_bytes()
    (served / "truncated.sig").write_bytes(whole[: len(whole) // 2])
    return {"served": served, "release": release_pem, "release_key": release, "lab": lab_pem}


def _settings(mirror: dict[str, Any]) -> str:
    return "apiVersion: reconciler/v1\nkind: Settings\nspec:\n" + signers_yaml(
        ("ml-release", mirror["release"], ["llama-*"]), ("lab", mirror["lab"], ["qwen-*"])
    )


def _artifacts(nginx: NginxServer) -> list[dict[str, Any]]:
    return [
        {"name": name, "path": path, "url": nginx.url(path),
         "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        for name, (path, data) in zip(("weights", "tokenizer"), FILES.items(), strict=True)
    ]  # fmt: skip


def _target(
    model: str, provider: str, artifacts: list[dict[str, Any]], signature: str, data: bytes
) -> str:
    """A rollout's target in flow YAML: ``artifacts`` signed by the
    signature file ``data`` served at ``signature``."""
    listed = ", ".join(
        "{" + ", ".join(f"{k}: '{v}'" if k == "url" else f"{k}: {v}" for k, v in a.items()) + "}"
        for a in artifacts
    )
    signed = (
        f"{{url: '{signature}', sha256: {hashlib.sha256(data).hexdigest()}, size: {len(data)}}}"
    )
    return (
        f"{{runtime: hermes, provider: {provider}, model: {model}, profile: default, "
        f"artifacts: [{listed}], signature: {signed}}}"
    )


def _rollout(case: str, nginx: NginxServer, served: Path) -> str:
    model, made, _ = CASES[case]
    signature = served / f"{made}.sig"
    target = _target(
        model, "vllm", _artifacts(nginx), nginx.url(signature.name), signature.read_bytes()
    )
    return rollout_yaml(case, target=target, nodeIds=[case], live=True, onFailure="stop")


def _plant_symlink(state: Path, nginx: NginxServer, outside: Path) -> None:
    """The model directory already there, complete, with a link to a folder
    outside it: what a careless or hostile hand on the node leaves."""
    artifacts = _artifacts(nginx)
    store = state / "artifacts" / "sha256"
    store.mkdir(parents=True, exist_ok=True)
    pairs = layout_pairs(artifacts)
    ident = model_id(pairs)
    models = state / "models"
    (models / ident).mkdir(parents=True, exist_ok=True)
    (models / f"{ident}.json").write_bytes(manifest_bytes(pairs))
    for artifact, data in zip(artifacts, FILES.values(), strict=True):
        (store / artifact["sha256"]).write_bytes(data)
        os.link(store / artifact["sha256"], models / ident / artifact["path"])
    outside.mkdir()
    (outside / "payload.bin").write_bytes(b"not signed\n")
    os.symlink(outside, models / ident / "extra")


@pytest.fixture
def fleet(tmp_path: Path, mirror: dict[str, Any]) -> Iterator[tuple[AgentFleet, NginxServer]]:
    with NginxServer(tmp_path / "nginx", mirror["served"]) as nginx:
        nodes: dict[str, dict[str, Any]] = {
            case: {"config": OLD, "labels": {"role": "gpu"}} for case in CASES
        }
        nodes["good"]["agent_key"] = "own"  # signed evidence, for the attestation
        kit = AgentFleet.create(tmp_path, nodes, files={"reconciler.yaml": _settings(mirror)})
        try:
            yield kit, nginx
        finally:
            kit.close()


def test_a_signed_model_rolls_out_and_every_bad_signature_is_stage_failed(
    fleet: tuple[AgentFleet, NginxServer],
    mirror: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kit, nginx = fleet
    _plant_symlink(kit.agents["symlink"].state, nginx, tmp_path / "outside")
    kit.push({f"rollouts/{case}.yaml": _rollout(case, nginx, mirror["served"]) for case in CASES})

    def settled(statuses: dict[str, Any]) -> bool:
        return all(
            statuses.get(case, {}).get("phase") in ("completed", "paused", "stopped")
            and (case == "good" or statuses[case].get("hold"))
            for case in CASES
        )

    done = kit.run_until(kit.daemon(), settled, timeout=240)

    good = done["good"]
    assert good["phase"] == "completed", good
    (node,) = good["nodes"]
    signature_sha = good["frozen"]["signature"]["sha256"]
    vouched = {"signer": "ml-release", "sha256": signature_sha}
    assert node["signature"] == vouched and node["stage"]["signature"] == vouched
    config = load_yaml("config", kit.agents["good"].config_bytes() or b"")
    assert config["signedBy"] == "ml-release" and config["model"] == "llama-3"
    assert [s["name"] for s in good["frozen"]["signers"]] == ["ml-release"]
    (stage,) = kit.agents["good"].jobs_of_kind("stage")
    assert [s["name"] for s in stage["payload"]["signers"]] == ["ml-release"]
    # the signature was staged into the store, never into the model directory
    model_dir = Path(config["modelDir"])
    assert sorted(p.name for p in model_dir.iterdir()) == ["model.gguf", "tokenizer.json"]
    assert (kit.agents["good"].state / "artifacts" / "sha256" / signature_sha).exists()

    for case, (_, _, said) in CASES.items():
        if case == "good":
            continue
        status = done[case]
        (node,) = status["nodes"]
        assert status["hold"]["reason"] == "stage_failed", (case, status)
        assert node["stage"]["state"] == "failed", (case, node)
        assert "signature_invalid" in node["stage"]["error"], (case, node)
        assert said in node["stage"]["error"], (case, node["stage"]["error"])
        assert "signature" not in node, (case, node)
        agent = kit.agents[case]
        assert agent.jobs_of_kind("apply") == [], case
        assert agent.config_bytes() == OLD, case
    # the lab signer's key went to the qwen node, ml-release's did not
    (stage,) = kit.agents["not-covered"].jobs_of_kind("stage")
    assert [s["name"] for s in stage["payload"]["signers"]] == ["lab"]

    # who vouched, where people look: status, the attestation, verify
    capsys.readouterr()
    assert cli(["status", "good", "--repo", str(kit.bare)]) == 0
    shown = capsys.readouterr().out
    assert f"signed by ml-release (signature {signature_sha[:12]})" in shown, shown
    attestation = tmp_path / "good.attestation.json"
    key = ["--key", str(kit.key_path)]
    assert cli(["attest", "good", "--repo", str(kit.bare), *key, "--out", str(attestation)]) == 0
    public = kit.key_path.with_name("reconciler.pub")
    consumed = consumer(attestation, public, tmp_path)
    assert consumed.returncode == 0, consumed.stderr[-2000:]
    predicate = json.loads(consumed.stdout)["statement"]["predicate"]
    assert predicate["nodes"][0]["signature"] == vouched
    capsys.readouterr()
    verified = ["verify", "--attestation", str(attestation), "--key", str(public)]
    assert cli([*verified, "--repo", str(kit.bare)]) == 0
    said = capsys.readouterr().out
    assert f"model files signed by ml-release (signature {signature_sha[:12]})" in said, said


def test_an_apply_of_a_signed_target_is_refused_unless_its_directory_was_verified(
    tmp_path: Path, mirror: dict[str, Any]
) -> None:
    """The agent alone: its files held, its directory laid out, but never
    verified against the signature, and a signed live apply arrives."""
    owner = make_key(tmp_path / "keys" / "reconciler")
    state = tmp_path / "state"
    (state / "runtimes").mkdir(parents=True)
    (state / "runtimes" / "hermes.yaml").write_bytes(OLD)
    with NginxServer(tmp_path / "nginx", mirror["served"]) as nginx:
        artifacts = _artifacts(nginx)
        _plant_symlink(state, nginx, tmp_path / "outside")  # held and laid out, not verified
        data = (mirror["served"] / "release.sig").read_bytes()
        signature = Artifact(
            "signature", nginx.url("release.sig"), hashlib.sha256(data).hexdigest(), len(data)
        )
        agent = AgentThread(state, [owner.signing])
        try:
            status, answer = agent.post(
                envelope(
                    job(
                        "apply-1",
                        artifacts=tuple(Artifact(**a) for a in artifacts),
                        signature=signature,
                        signers=(ModelSigner("ml-release", mirror["release"]),),
                    ),
                    owner.signing,
                )
            )
        finally:
            agent.close()
    assert (status, answer["error"]) == (409, "not_staged"), answer
    assert "was not verified against signature" in answer["message"]
    assert (state / "runtimes" / "hermes.yaml").read_bytes() == OLD


@pytest.fixture
def llama(tmp_path: Path) -> Iterator[LlamaNode]:
    server = LlamaNode(llama_server_binary(), free_port(), tmp_path / "run")
    try:
        yield server
    finally:
        server.stop()


def test_a_signed_gguf_model_is_served_by_llama_server_from_its_verified_directory(
    tmp_path: Path, mirror: dict[str, Any], models: Models, llama: LlamaNode
) -> None:
    """The producer signs its release directory (one GGUF file); the node's
    llama-server serves another model until the live rollout's after-apply
    script restarts it on ``{modelDir}/model.gguf``."""
    old, new = models.model(1), models.model(2)
    release = _model(tmp_path / "release", {"model.gguf": new.read_bytes()})
    served = tmp_path / "mirror"
    _model(served, {"model.gguf": new.read_bytes()})
    _sign(release, mirror["release_key"], served / "llama.sig")
    (tmp_path / "initial.yaml").write_bytes(node_config(old, 1))
    started = llama.start(tmp_path / "initial.yaml")
    assert started.returncode == 0, started.stderr
    assert complete(llama.url)["model"] == str(old)
    with NginxServer(tmp_path / "nginx", served) as nginx:
        artifact = model_artifact(nginx.url("model.gguf"), new)
        assert artifact.path == "model.gguf"
        artifacts = [asdict(artifact)]
        node = {
            "config": node_config(old, 1),
            "after_apply": llama.after_apply(),
            "extra": ("--after-apply-timeout", "90s"),
        }
        kit = AgentFleet.create(
            tmp_path, {"llama": node}, files={"reconciler.yaml": _settings(mirror)}
        )
        try:
            signature = served / "llama.sig"
            target = _target(
                "llama-3", "llama.cpp", artifacts, nginx.url("llama.sig"), signature.read_bytes()
            )
            rollout = rollout_yaml("signed", target=target, nodeIds=["llama"], live=True)
            kit.push({"rollouts/signed.yaml": rollout})
            done = kit.run_until(
                kit.daemon(),
                lambda s: s.get("signed", {}).get("phase") in ("completed", "paused", "stopped"),
                timeout=240,
            )
            config = load_yaml("config", kit.agents["llama"].config_bytes() or b"")
            state = kit.agents["llama"].state
        finally:
            kit.close()
    status = done["signed"]
    assert status["phase"] == "completed", status
    (record,) = status["nodes"]
    vouched = {"signer": "ml-release", "sha256": hashlib.sha256(signature.read_bytes()).hexdigest()}
    assert record["signature"] == vouched
    assert config["signedBy"] == "ml-release" and config["model"] == "llama-3"
    model_dir = state / "models" / model_id(layout_pairs(artifacts))
    assert config["modelDir"] == str(model_dir)
    # llama-server answers from the file in the verified directory: the
    # bytes the producer signed, not the file it served before.
    answered = complete(llama.url)["model"]
    assert answered == str(model_dir / "model.gguf")
    assert file_digest(Path(answered)) == file_digest(release / "model.gguf") == artifact.sha256
