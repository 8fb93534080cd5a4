// reactor ui: the page. Plain JS, no dependencies; every text from the database goes
// into the page through textContent, never as HTML.
"use strict";

const FEED_ROWS = 200; // rows kept in the change feed
const REFRESH_MS = 5000; // scopes and stats are also refreshed this often
const $ = (id) => document.getElementById(id);

const view = {
  scope: null, // the scope whose keys are listed
  key: null, // the key whose value is shown
  ttlDeadline: null, // when the shown key expires (ms since epoch), or null
  writable: false,
  feed: null, // the EventSource
  lastRevision: null, // the last revision the feed delivered
  refreshTimer: null,
  pending: { keys: false, value: false }, // what the next refresh must reload
};

// -- the API ---------------------------------------------------------------------
async function getJSON(path, params) {
  const query = params ? "?" + new URLSearchParams(params).toString() : "";
  const response = await fetch("api/" + path + query, { headers: { Accept: "application/json" } });
  const body = await response.json().catch(() => ({}));
  return { ok: response.ok, status: response.status, body };
}

// ``body`` is JSON text: values go in as typed, so that 1.0 stays a float.
async function post(path, body) {
  const response = await fetch("api/" + path, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Reactor-UI": "1" },
    body,
  });
  const data = await response.json().catch(() => ({}));
  return { ok: response.ok, status: response.status, body: data };
}

function errorText(result) {
  const body = result.body || {};
  if (body.error) return body.error + ": " + (body.message || "");
  return "HTTP " + result.status;
}

function show(text, kind) {
  const message = $("message");
  message.textContent = text;
  message.className = kind || "";
}

function compact(value) {
  if (value === undefined || value === null) return "∅";
  const text = JSON.stringify(value);
  return text.length > 80 ? text.slice(0, 77) + "…" : text;
}

function item(text, count, selected, onClick) {
  const li = document.createElement("li");
  const button = document.createElement("button");
  button.type = "button";
  button.className = selected ? "selected" : "";
  const name = document.createElement("span");
  name.className = "name";
  name.textContent = text;
  button.append(name);
  if (count !== undefined) {
    const badge = document.createElement("span");
    badge.className = "count";
    badge.textContent = String(count);
    button.append(badge);
  }
  button.addEventListener("click", onClick);
  li.append(button);
  return li;
}

// -- panels ----------------------------------------------------------------------
async function loadInfo() {
  const result = await getJSON("info");
  if (!result.ok) return;
  $("database").textContent = result.body.database;
  view.writable = result.body.write;
  $("mode").textContent = view.writable ? "read-write" : "read-only";
  $("mode").className = "badge " + (view.writable ? "warn" : "");
  $("editor").hidden = !view.writable;
}

async function loadScopes() {
  const result = await getJSON("scopes");
  if (!result.ok) return;
  const scopes = result.body.scopes;
  const list = $("scopes");
  list.replaceChildren(
    ...Object.entries(scopes).map(([name, count]) =>
      item(name, count, name === view.scope, () => pickScope(name)),
    ),
  );
  $("scopes-empty").hidden = Object.keys(scopes).length > 0;
}

function pickScope(name) {
  view.scope = name;
  $("keys-scope").textContent = name;
  if (view.writable) $("edit-scope").value = name;
  loadScopes();
  loadKeys();
}

async function loadKeys() {
  if (view.scope === null) return;
  const pattern = $("key-pattern").value || "*";
  const result = await getJSON("keys", { scope: view.scope, pattern });
  const list = $("keys");
  if (!result.ok) {
    list.replaceChildren();
    $("keys-empty").hidden = false;
    $("keys-empty").textContent = errorText(result);
    return;
  }
  const keys = result.body.keys;
  list.replaceChildren(...keys.map((key) => item(key, undefined, key === view.key, () => pickKey(key))));
  $("keys-empty").hidden = keys.length > 0;
  $("keys-empty").textContent = "No key matches.";
}

function pickKey(key) {
  view.key = key;
  loadKeys();
  loadValue(true);
}

async function loadValue(fillEditor) {
  if (view.scope === null || view.key === null) return;
  const result = await getJSON("value", { scope: view.scope, key: view.key });
  $("value-where").textContent = view.scope + " / " + view.key;
  if (!result.ok) {
    $("value").textContent = "";
    view.ttlDeadline = null;
    $("value-ttl").textContent = result.status === 404 ? "no such key" : errorText(result);
    return;
  }
  $("value").textContent = result.body.text;
  const ttl = result.body.ttl;
  view.ttlDeadline = ttl === null ? null : Date.now() + ttl * 1000;
  showTTL();
  if (fillEditor && view.writable) {
    $("edit-scope").value = view.scope;
    $("edit-key").value = view.key;
    $("edit-value").value = result.body.text;
    $("edit-ttl").value = "";
    $("edit-keep-ttl").checked = ttl !== null; // editing a value keeps its expiry
  }
}

function showTTL() {
  if (view.key === null || $("value").textContent === "") return;
  if (view.ttlDeadline === null) {
    $("value-ttl").textContent = "no expiry";
    return;
  }
  const left = Math.max(0, (view.ttlDeadline - Date.now()) / 1000);
  $("value-ttl").textContent = "expires in " + left.toFixed(1) + " s";
}

function formatBytes(count) {
  const units = ["B", "KiB", "MiB", "GiB"];
  let value = count;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return (unit === 0 ? value : value.toFixed(1)) + " " + units[unit];
}

async function loadStats() {
  const result = await getJSON("stats");
  if (!result.ok) return;
  const stats = result.body;
  const lagging = Object.values(stats.durable_subscribers || {}).reduce(
    (most, subscriber) => Math.max(most, subscriber.lag),
    0,
  );
  const figures = [
    ["revision", stats.revision],
    ["keys", stats.keys],
    ["scopes", Object.keys(stats.scopes).length],
    ["size", formatBytes(stats.database_bytes)],
    ["locks held", stats.locks_held],
    ["keys expired", stats.keys_expired],
    ["durable subscribers", Object.keys(stats.durable_subscribers || {}).length],
    ["largest lag", lagging],
  ];
  $("stats").replaceChildren(
    ...figures.flatMap(([name, value]) => {
      const dt = document.createElement("dt");
      dt.textContent = name;
      const dd = document.createElement("dd");
      dd.textContent = String(value);
      return [dt, dd];
    }),
  );
  $("stats-json").textContent = JSON.stringify(stats, null, 2);
}

// -- the change feed -------------------------------------------------------------
function follow(fresh) {
  if (view.feed !== null) view.feed.close();
  const params = new URLSearchParams({ scope: $("feed-scope").value || "*", key: $("feed-key").value || "*" });
  if (fresh) {
    view.lastRevision = null;
    $("feed").tBodies[0].replaceChildren();
  } else if (view.lastRevision !== null) {
    params.set("since", String(view.lastRevision));
  }
  const feed = new EventSource("api/events?" + params.toString());
  view.feed = feed;
  feed.addEventListener("ready", (message) => {
    view.lastRevision = Number(message.lastEventId);
    const ready = JSON.parse(message.data);
    setConnection("live", "live from #" + ready.revision);
    if (ready.notice) show(ready.notice, "warn");
  });
  feed.addEventListener("change", (message) => {
    const event = JSON.parse(message.data);
    view.lastRevision = event.revision;
    addRow(event);
    changed(event);
  });
  feed.addEventListener("error", () => {
    if (feed.readyState === EventSource.CLOSED) {
      // The browser gave up (the server answered with an error): start again, from
      // the last revision seen, in a while.
      setConnection("down", "disconnected");
      setTimeout(() => {
        if (view.feed === feed) follow(false);
      }, 3000);
    } else {
      setConnection("down", "reconnecting…");
    }
  });
}

function setConnection(state, text) {
  $("connection").textContent = text;
  $("connection").className = "badge " + state;
}

function addRow(event) {
  const row = document.createElement("tr");
  row.className = "event " + event.type;
  row.dataset.revision = String(event.revision);
  const cells = [
    "#" + event.revision,
    event.type,
    event.scope,
    event.key,
    compact(event.old_value) + " → " + compact(event.new_value),
  ];
  for (const text of cells) {
    const cell = document.createElement("td");
    cell.textContent = text;
    row.append(cell);
  }
  row.cells[4].title = JSON.stringify(event.old_value) + " → " + JSON.stringify(event.new_value);
  const body = $("feed").tBodies[0];
  body.prepend(row);
  while (body.rows.length > FEED_ROWS) body.deleteRow(-1);
}

// A change may concern what is on show: refresh it a little later, once for a burst.
function changed(event) {
  const pending = view.pending;
  pending.keys ||= event.scope === view.scope;
  pending.value ||= event.scope === view.scope && event.key === view.key;
  clearTimeout(view.refreshTimer);
  view.refreshTimer = setTimeout(() => {
    view.pending = { keys: false, value: false };
    loadScopes();
    loadStats();
    if (pending.keys) loadKeys();
    if (pending.value) loadValue(false);
  }, 150);
}

// -- writes ----------------------------------------------------------------------
function target() {
  const scope = $("edit-scope").value;
  const key = $("edit-key").value;
  return '"scope":' + JSON.stringify(scope) + ',"key":' + JSON.stringify(key);
}

function checkedJSON(text, what) {
  try {
    JSON.parse(text);
    return true;
  } catch (error) {
    show(what + " is not JSON: " + error.message, "error");
    return false;
  }
}

async function afterWrite(result, done) {
  if (!result.ok) {
    show(errorText(result), "error");
    return;
  }
  show(done(result.body), "ok");
  view.scope = $("edit-scope").value;
  view.key = $("edit-key").value;
  $("keys-scope").textContent = view.scope;
  await Promise.all([loadScopes(), loadKeys(), loadValue(false), loadStats()]);
}

async function doSet() {
  const text = $("edit-value").value.trim();
  if (!checkedJSON(text, "the value")) return;
  const ttl = $("edit-ttl").value.trim();
  let options = "";
  if (ttl) options = ',"ttl":' + Number(ttl);
  else if ($("edit-keep-ttl").checked) options = ',"keep_ttl":true';
  // The value text goes in as the user typed it (checked above to be one JSON value).
  const body = "{" + target() + ',"value":' + text + options + "}";
  await afterWrite(await post("set", body), () => "saved");
}

async function doUpdate() {
  let text = $("edit-ops").value.trim();
  if (!checkedJSON(text, "the ops")) return;
  if (!text.startsWith("[")) text = "[" + text + "]"; // one op alone
  const atomic = $("edit-atomic").checked;
  const body = "{" + target() + ',"ops":' + text + ',"atomic":' + atomic + "}";
  await afterWrite(await post("update", body), (data) =>
    data.errors.length === 0
      ? "updated"
      : data.errors.length + " op(s) did not apply: " + data.errors.map((e) => e.message).join("; "),
  );
}

async function doDelete() {
  await afterWrite(await post("delete", "{" + target() + "}"), (data) =>
    data.deleted ? "deleted" : "there was no such key",
  );
}

// -- start -----------------------------------------------------------------------
function start() {
  $("key-pattern").addEventListener("input", () => loadKeys());
  $("feed-filter").addEventListener("submit", (event) => {
    event.preventDefault();
    follow(true);
  });
  $("do-set").addEventListener("click", doSet);
  $("do-update").addEventListener("click", doUpdate);
  $("do-delete").addEventListener("click", doDelete);
  loadInfo();
  loadScopes();
  loadStats();
  follow(true);
  setInterval(showTTL, 1000);
  setInterval(() => {
    loadScopes();
    loadStats();
  }, REFRESH_MS);
}

document.addEventListener("DOMContentLoaded", start);
