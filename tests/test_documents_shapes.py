"""Documents: the rollout-shape fields of docs/rollouts.md in settings
and across rollouts (windows, freezes, ``after`` cycles, ``batches``)."""

from __future__ import annotations

from pathlib import Path

from reconciler.spec.documents import assemble, parse_file

SETTINGS_HEAD = "apiVersion: reconciler/v1\nkind: Settings\nspec:\n"


def settings_problems(body: str) -> list[str]:
    parsed = parse_file("reconciler.yaml", (SETTINGS_HEAD + body).encode())
    return [str(p) for p in parsed.problems]


def rollout(name: str, body: str) -> tuple[str, bytes]:
    text = (
        "apiVersion: reconciler/v1\nkind: Rollout\n"
        f"metadata: {{name: {name}}}\nspec:\n"
        "  target: {runtime: hermes, provider: ollama, model: llama3.1-8b}\n"
        "  selector: {role: canary}\n" + body
    )
    return f"rollouts/{name}.yaml", text.encode()


def test_windows_and_freezes_are_read_with_their_zone() -> None:
    parsed = parse_file(
        "reconciler.yaml",
        (
            SETTINGS_HEAD + "  windows:\n"
            '    - {days: [mon, tue, Wed], from: "09:00", to: "17:30", timezone: Europe/Berlin}\n'
            "  freezes:\n"
            '    - {from: "2026-12-24T00:00:00Z", to: "2026-12-27T00:00:00Z", reason: holidays}\n'
        ).encode(),
    )
    assert parsed.problems == ()
    assert parsed.settings is not None
    (window,) = parsed.settings.windows
    assert window.days == frozenset({0, 1, 2})
    assert (window.start, window.end) == (9 * 60, 17 * 60 + 30)
    assert str(window.zone) == "Europe/Berlin"
    (freeze,) = parsed.settings.freezes
    assert freeze.reason == "holidays" and freeze.end.day == 27


def test_an_unknown_zone_names_the_field_and_what_to_write() -> None:
    problems = settings_problems(
        '  windows:\n    - {days: [mon], from: "09:00", to: "17:00", timezone: Europe/Berlln}\n'
    )
    assert problems == [
        'reconciler.yaml:5:59: spec.windows[0].timezone: unknown time zone "Europe/Berlln": '
        "write an IANA zone name such as Europe/Berlin, America/New_York or UTC"
    ]


def test_a_window_closing_before_it_opens_is_refused() -> None:
    (problem,) = settings_problems(
        '  windows:\n    - {days: [mon], from: "17:00", to: "09:00", timezone: UTC}\n'
    )
    assert problem.startswith("reconciler.yaml:5:40: spec.windows[0].to: the window closes at")
    assert "not after it opens at 17:00" in problem


def test_a_misspelt_day_gets_a_suggestion() -> None:
    (problem,) = settings_problems(
        '  windows:\n    - {days: [mon, thurs], from: "09:00", to: "17:00", timezone: UTC}\n'
    )
    assert problem == (
        'reconciler.yaml:5:20: spec.windows[0].days[1]: "thurs" is not a day of the week; '
        "did you mean thu?"
    )


def test_a_time_of_day_without_quotes_or_form_is_refused() -> None:
    (problem,) = settings_problems(
        '  windows:\n    - {days: [mon], from: "9am", to: "17:00", timezone: UTC}\n'
    )
    assert "spec.windows[0].from: must be a time of day HH:MM" in problem


def test_a_freeze_ending_before_it_begins_is_refused() -> None:
    (problem,) = settings_problems(
        '  freezes:\n    - {from: "2026-12-27T00:00:00Z", to: "2026-12-24T00:00:00Z"}\n'
    )
    assert problem.startswith("reconciler.yaml:5:42: spec.freezes[0].to: the freeze ends at")
    assert "put to after from" in problem


def test_an_after_cycle_is_named_in_each_file() -> None:
    documents = assemble(
        parse_file(path, data)
        for path, data in (
            rollout("a", "  after: [b]\n"),
            rollout("b", "  after: [c]\n"),
            rollout("c", "  after: [a]\n"),
            rollout("d", "  after: [a]\n"),
        )
    )
    messages = [str(p) for p in documents.problems]
    assert messages[0] == (
        "rollouts/a.yaml:7:11: spec.after[0]: after makes a cycle: a -> b -> c -> a; no "
        "rollout in it could ever start: remove one of these names from its after list"
    )
    assert len(messages) == 3
    assert set(documents.invalid_rollouts) == {"a", "b", "c"}
    assert documents.rollouts["d"].after == ("a",)


def test_batches_and_timed_pauses_are_read() -> None:
    parsed = parse_file(
        *rollout("grow", '  batches: [1, "10%", "50%"]\n  pauseAfter: [1, {batch: 2, for: 10m}]\n')
    )
    assert parsed.problems == ()
    assert parsed.rollout is not None
    assert parsed.rollout.batches == (1, "10%", "50%")
    assert parsed.rollout.pause_after == (1, 2)
    assert parsed.rollout.pause_for == ((2, 600),)


def test_a_batch_listed_twice_in_pause_after_is_refused() -> None:
    parsed = parse_file(*rollout("twice", "  pauseAfter: [1, {batch: 1, for: 10m}]\n"))
    assert [p.field for p in parsed.problems] == ["spec.pauseAfter[1]"]


def test_the_commented_windows_and_freezes_of_the_example_settings_are_valid() -> None:
    """example-repo/reconciler.yaml shows windows and freezes as comments
    (the demo and ``init`` copy it, and must not wait for a window); with
    the comment marks taken away they are a valid settings document."""
    example = Path(__file__).resolve().parent.parent / "example-repo" / "reconciler.yaml"
    text = example.read_text()
    assert "  # windows:\n" in text and "  # freezes:\n" in text
    start = text.index("  # windows:\n")
    block = text[start:].replace("  # ", "  ", -1)
    parsed = parse_file("reconciler.yaml", (text[:start] + block).encode())
    assert parsed.problems == ()
    assert parsed.settings is not None
    assert [sorted(w.days) for w in parsed.settings.windows] == [[0, 1, 2, 3], [4]]
    assert parsed.settings.freezes[0].reason == "year-end freeze"
