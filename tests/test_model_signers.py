"""``modelSigners`` in reconciler.yaml and ``target.signature`` in a
rollout (docs/rollouts.md#model-signatures): what validation accepts,
refuses, and says where. Keys made by the real ``openssl``."""

from __future__ import annotations

import pytest

from reconciler.spec import documents
from tests.kit.documents import node_yaml
from tests.kit.producer_keys import openssl_key, signers_yaml


def settings_yaml(*signers: tuple[str, str, list[str] | None]) -> str:
    return "apiVersion: reconciler/v1\nkind: Settings\nspec:\n" + signers_yaml(*signers)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("keys")
    return {
        "p256": openssl_key(folder, "p256")[1],
        "p384": openssl_key(folder, "p384", "secp384r1")[1],
        "k1": openssl_key(folder, "k1", "secp256k1")[1],
        "rsa": openssl_key(folder, "rsa", "rsa")[1],
    }


def test_ec_keys_on_p256_and_p384_are_signers(keys: dict[str, str]) -> None:
    text = settings_yaml(("ml-release", keys["p256"], ["llama-*"]), ("lab", keys["p384"], None))
    parsed = documents.parse_file("reconciler.yaml", text.encode())
    assert parsed.problems == ()
    assert parsed.settings is not None
    release, lab = parsed.settings.model_signers
    assert (release.name, release.models, release.public_key) == (
        "ml-release",
        ("llama-*",),
        keys["p256"],
    )
    assert (lab.name, lab.models) == ("lab", ("*",))


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("rsa", "is not an EC key"),
        ("k1", "is an EC key on secp256k1, not on P-256 or P-384"),
        ("junk", "is not a PEM public key"),
    ],
)
def test_a_key_that_is_not_an_ec_p256_or_p384_key_is_an_error_at_its_line(
    keys: dict[str, str], key: str, said: str
) -> None:
    pem = keys.get(key, "-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n")
    text = settings_yaml(("ok", keys["p256"], None), ("bad", pem, None))
    (problem,) = documents.parse_file("reconciler.yaml", text.encode()).problems
    line = text.splitlines().index("    - name: bad") + 2  # its publicKey
    assert (problem.line, problem.field) == (line, "spec.modelSigners[1].publicKey")
    assert 'signer "bad": the key ' + said in problem.message


def test_a_signer_named_twice_is_an_error(keys: dict[str, str]) -> None:
    text = settings_yaml(("twice", keys["p256"], None), ("twice", keys["p384"], None))
    (problem,) = documents.parse_file("reconciler.yaml", text.encode()).problems
    assert problem.field == "spec.modelSigners[1].name"
    assert "named twice" in problem.message


DIGEST = "0f" * 32
SIG_DIGEST = "5e" * 32


def llama(model: str = "llama-3", signature: bool = True, artifacts: bool = True) -> str:
    text = (
        "apiVersion: reconciler/v1\nkind: Rollout\nmetadata: {name: llama}\nspec:\n"
        f"  target:\n    runtime: hermes\n    provider: ollama\n    model: {model}\n"
    )
    if artifacts:
        text += (
            "    artifacts:\n"
            f'      - {{name: weights, url: "http://127.0.0.1:1/w.gguf", sha256: {DIGEST}, '
            "size: 4096}\n"
        )
    if signature:
        text += (
            f'    signature: {{url: "http://127.0.0.1:1/model.sig", sha256: {SIG_DIGEST}, '
            "size: 2304}\n"
        )
    return text + "  nodeIds: [gpu-1]\n"


def assembled(settings: str, rollout: str) -> documents.Documents:
    files = {
        "reconciler.yaml": settings,
        "nodes/gpu-1.yaml": node_yaml("gpu-1"),
        "rollouts/llama.yaml": rollout,
    }
    return documents.assemble(documents.parse_file(p, t.encode()) for p, t in files.items())


def test_a_covered_model_carries_its_signature_and_the_signers_keys(
    keys: dict[str, str],
) -> None:
    settings = settings_yaml(
        ("ml-release", keys["p256"], ["llama-*"]), ("other", keys["p384"], ["qwen-*"])
    )

    docs = assembled(settings, llama())

    assert docs.problems == ()
    spec = docs.rollouts["llama"]
    assert spec.signature is not None
    assert (spec.signature.sha256, spec.signature.size) == (SIG_DIGEST, 2304)
    assert [s.name for s in spec.signers] == ["ml-release"]


def test_a_covered_model_without_a_signature_is_refused_naming_the_signer(
    keys: dict[str, str],
) -> None:
    settings = settings_yaml(("ml-release", keys["p256"], ["llama-*"]))

    docs = assembled(settings, llama(signature=False))

    (problem,) = docs.problems
    assert problem.path == "rollouts/llama.yaml" and problem.field == "spec.target.signature"
    assert 'model "llama-3" is covered by signer ml-release in reconciler.yaml' in problem.message
    assert "llama" not in docs.rollouts


def test_a_signature_no_signer_covers_is_refused(keys: dict[str, str]) -> None:
    settings = settings_yaml(("ml-release", keys["p256"], ["llama-*"]))

    docs = assembled(settings, llama(model="qwen-2"))

    (problem,) = docs.problems
    assert problem.line == 11 and problem.field == "spec.target.signature"
    assert "no signer in reconciler.yaml covers model qwen-2" in problem.message


def test_a_signature_needs_artifacts(keys: dict[str, str]) -> None:
    settings = settings_yaml(("ml-release", keys["p256"], None))

    docs = assembled(settings, llama(artifacts=False))

    assert any(
        p.field == "spec.target.signature" and "vouches for target.artifacts" in p.message
        for p in docs.problems
    )


def test_plan_names_the_signer_or_says_unsigned(keys: dict[str, str]) -> None:
    from datetime import UTC, datetime

    from reconciler.text import plan

    settings = settings_yaml(("ml-release", keys["p256"], ["llama-*"]))
    base = {"reconciler.yaml": settings, "nodes/gpu-1.yaml": node_yaml("gpu-1")}
    texts = []
    for model, signed in (("llama-3", True), ("qwen-2", False)):
        head = {**base, "rollouts/llama.yaml": llama(model=model, signature=signed)}
        result = plan.make_plan(
            plan.Tree("a" * 40, {p: t.encode() for p, t in base.items()}),
            plan.Tree("b" * 40, {p: t.encode() for p, t in head.items()}),
            {},
            now=datetime.now(UTC),
        )
        texts.append(plan.render_text(result))
    assert "signed by ml-release" in texts[0]
    assert "unsigned (no signer covers this model)" in texts[1]


def test_plan_names_signers_not_their_keys_when_they_change(keys: dict[str, str]) -> None:
    from datetime import UTC, datetime

    from reconciler.text import plan

    one = settings_yaml(("ml-release", keys["p256"], ["llama-*"]))
    two = settings_yaml(("ml-release", keys["p256"], ["llama-*"]), ("lab", keys["p384"], None))
    base = {"reconciler.yaml": one, "nodes/gpu-1.yaml": node_yaml("gpu-1")}
    base["rollouts/llama.yaml"] = llama().replace(
        "  nodeIds:", '  startAt: "2099-01-01T00:00:00Z"\n  nodeIds:'
    )
    head = {**base, "reconciler.yaml": two}

    text = plan.render_text(
        plan.make_plan(
            plan.Tree("a" * 40, {p: t.encode() for p, t in base.items()}),
            plan.Tree("b" * 40, {p: t.encode() for p, t in head.items()}),
            {},
            now=datetime.now(UTC),
        )
    )

    assert "signers [ml-release] -> [ml-release, lab] (not started yet: applies)" in text, text
    assert "BEGIN PUBLIC KEY" not in text
