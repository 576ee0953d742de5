// The daemon's web page (docs/web.md). The server renders it whole, data
// included, so it reads without JavaScript; this script keeps it live: when
// /api/v1/events says a status commit was made or read, it fetches the same
// page again and swaps its content in, without a reload.
"use strict";

const $ = (id) => document.getElementById(id);

// The page's own address for the rollout shown: an old link's #rollout=NAME
// becomes ?rollout=NAME, which the server renders.
function pageUrl() {
  const match = /^#rollout=(.+)$/.exec(location.hash);
  const url = new URL(location.href);
  url.hash = "";
  if (match) url.search = `?rollout=${match[1]}`;
  return url;
}

async function refresh() {
  const url = pageUrl();
  let answer;
  try {
    answer = await fetch(url, { cache: "no-store", headers: { Accept: "text/html" } });
  } catch (error) {
    return; // the event stream says when the daemon is back
  }
  if (answer.status === 503) {
    setTimeout(refresh, 1000); // the daemon's first read is coming
    return;
  }
  if (!answer.ok) return;
  const fresh = new DOMParser().parseFromString(await answer.text(), "text/html");
  const main = fresh.getElementById("main");
  if (!main) return;
  $("main").replaceChildren(...main.childNodes);
  $("commit").replaceChildren(...fresh.getElementById("commit").childNodes);
}

let pending = null;
function soon() {
  if (pending === null) pending = setTimeout(() => { pending = null; refresh(); }, 50);
}

function choose() {
  const url = pageUrl();
  if (url.href !== location.href) history.replaceState(null, "", url);
  return refresh().then(() => { if ($("detail")) $("detail").focus(); });
}

function listen() {
  const events = new EventSource("/api/v1/events");
  const live = $("live");
  events.onopen = () => { live.textContent = "Live: updates as status commits arrive."; live.className = "live"; soon(); };
  events.onerror = () => { live.textContent = "Disconnected: reconnecting…"; live.className = "down"; };
  for (const kind of ["commit", "transition", "fleet"]) events.addEventListener(kind, soon);
}

window.addEventListener("hashchange", choose);
document.addEventListener("DOMContentLoaded", () => {
  if (/^#rollout=/.test(location.hash)) choose();
  listen();
});
