"""``{slotPort}`` in a warm-up or eval URL of a rollout with ``standby``:
the agent writes there the port of the slot it is starting, so the
requests reach the new model before traffic moves to it
(docs/standby.md#the-switch)."""

from __future__ import annotations

SLOT_PORT = "{slotPort}"
_ANY_PORT = "1"  # stands in for the slot's port while the rest of the URL is checked


def url_to_check(url: str, standby: bool) -> tuple[str, str]:
    """(``url`` as the URL rules should read it, a problem of its own): with
    standby ``{slotPort}`` reads as a port; without, nothing would replace it."""
    if SLOT_PORT not in url:
        return url, ""
    if not standby:
        return url, (
            f"{SLOT_PORT} is the port of the slot a standby apply starts, and only a rollout "
            f"with standby starts one: set standby, or write the port: {url!r}"
        )
    return url.replace(SLOT_PORT, _ANY_PORT), ""
