// reactor ui: the page. Plain JS, no dependencies; every text from the database goes
// into the page through textContent, never as HTML. Values are shown from the JSON text
// the server writes (``text``, ``old_text``, ``new_text``, a patch's ``value``), never
// re-encoded here: JSON.parse turns 1.0 into 1 and rounds integers beyond 2**53.
"use strict";

const FEED_ROWS = 1000; // rows kept in the change feed, shown or hidden by its filters
const HISTORY_ROWS = 50; // changes of a key shown, newest first
const DEAD_ROWS = 50; // dead letters of a queue shown, in the order they died
const REFRESH_MS = 5000; // scopes and stats are also refreshed this often
const SETTLE_MS = 150; // a burst of changes refreshes the panels once, this long after it
const BURST_MS = 1000; // ... or this long after its first change, if it goes on
const $ = (id) => document.getElementById(id);

const view = {
  scope: null, // the scope whose keys are listed
  key: null, // the key whose value is shown
  ttlDeadline: null, // when the shown key expires (ms since epoch), or null
  writable: false,
  feed: null, // the EventSource
  lastRevision: null, // the last revision the feed delivered
  refreshTimer: null,
  refreshFirst: null, // when the first change the next refresh is for came (ms since epoch)
  pending: { keys: false, value: false, queues: false, runs: false }, // what the next refresh must reload
  deleting: null, // {scope, key} while the page asks whether to delete it
  lockDeadlines: [], // [cell, when the lease ends (ms since epoch)] of the locks shown
  timerDeadlines: [], // [row, when the timer is due (ms since epoch)] of the timers shown
  cancelling: null, // the timer {id, scope, key} while the page asks whether to cancel it
  queue: null, // the queue whose dead letters are shown
  queueAges: [], // [cell, since when its first job is ready (ms since epoch)] of the queues shown
  queueTotals: null, // {queues, dead, partial} of the last listing, for the stats panel
  retrying: null, // the queue {name, dead} while the page asks whether to retry its dead letters
  job: null, // the job shown: {queue, id, state, ...} as /api/job answers
  jobAction: null, // {kind: "cancel" | "purge", queue, id} while the page asks first
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

// JSON text (as the server wrote it), cut short for a table cell.
function clip(text, length = 80) {
  if (text === undefined || text === null) return "∅";
  return text.length > length ? text.slice(0, length - 3) + "…" : text;
}

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text;
  return td;
}

function rows(table, list, empty) {
  table.tBodies[0].replaceChildren(...list);
  if (empty) $(empty).hidden = list.length > 0;
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
  $("timers").classList.toggle("writable", view.writable);
  $("queues").classList.toggle("writable", view.writable);
  if (view.writable) {
    loadTimers(); // with its cancel buttons
    loadQueues(); // with its retry buttons
  }
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

let keysAsked = 0; // the number of the latest loadKeys: answers may come out of order

async function loadKeys() {
  if (view.scope === null) return;
  const asked = ++keysAsked;
  const pattern = $("key-pattern").value || "*";
  const result = await getJSON("keys", { scope: view.scope, pattern });
  if (asked !== keysAsked) return; // a later one (another pattern, a newer list) is due
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
  cancelDelete();
  loadKeys();
  loadValue(true);
  loadHistory();
}

async function loadValue(fillEditor) {
  if (view.scope === null || view.key === null) return;
  const where = { scope: view.scope, key: view.key };
  const result = await getJSON("value", where);
  if (view.scope !== where.scope || view.key !== where.key) return; // picked another since
  $("value-where").textContent = view.scope + " / " + view.key;
  if (!result.ok) {
    $("value").textContent = "";
    view.ttlDeadline = null;
    $("value-ttl").textContent = result.status === 404 ? "no such key" : errorText(result);
    $("value-version").textContent = "";
    return;
  }
  $("value").textContent = result.body.text;
  $("value-version").textContent =
    "version " + result.body.version + " · revision #" + result.body.revision +
    " · created at #" + result.body.created_revision;
  $("value-version").title =
    "version: 1 at creation, +1 per change; revision: of its last change (what " +
    "if_revision= compares with); created at: the revision that created the key";
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
    ["timers pending", stats.timers ? stats.timers.pending : 0],
    ["queues", ""], // from the queues panel's listing (showQueueTotals)
    ["dead letters", ""],
    ["durable subscribers", Object.keys(stats.durable_subscribers || {}).length],
    ["largest lag", lagging],
  ];
  $("stats").replaceChildren(
    ...figures.flatMap(([name, value]) => {
      const dt = document.createElement("dt");
      dt.textContent = name;
      const dd = document.createElement("dd");
      dd.textContent = String(value);
      dd.dataset.figure = name;
      return [dt, dd];
    }),
  );
  showQueueTotals();
  $("stats-json").textContent = JSON.stringify(stats, null, 2);
  showSubscribers(stats);
  showTimerFigures(stats.timers);
}

// Each durable subscriber: where it is in the log, and how far behind the database.
function showSubscribers(stats) {
  const subscribers = Object.entries(stats.durable_subscribers || {});
  subscribers.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const list = subscribers.map(([name, figures]) => {
    const row = document.createElement("tr");
    row.className = figures.lag > 0 ? "behind" : "";
    row.append(
      cell(name),
      cell("#" + figures.position),
      cell(String(figures.lag)),
      cell(String(figures.delivered)),
      cell(String(figures.failed)),
    );
    if (figures.failed > 0) row.cells[4].className = "bad";
    return row;
  });
  rows($("subscribers"), list, "subscribers-empty");
}

async function loadLocks() {
  const result = await getJSON("locks");
  if (!result.ok) return;
  const now = Date.now();
  view.lockDeadlines = [];
  const list = result.body.locks.map((lock) => {
    const row = document.createElement("tr");
    const left = cell("");
    row.append(cell(lock.name), cell(clip(lock.holder, 14)), cell(String(lock.token)), left);
    row.cells[1].title = lock.holder;
    view.lockDeadlines.push([left, now + lock.expires_in * 1000]);
    return row;
  });
  rows($("locks"), list, "locks-empty");
  if (result.body.held > list.length) {
    $("locks-empty").hidden = false;
    $("locks-empty").textContent = "and " + (result.body.held - list.length) + " more";
  } else {
    $("locks-empty").textContent = "No lock held.";
  }
  showLocksLeft();
}

function showLocksLeft() {
  const now = Date.now();
  for (const [left, deadline] of view.lockDeadlines) {
    left.textContent = deadline > now ? ((deadline - now) / 1000).toFixed(1) + " s" : "expired";
  }
}

// -- timers ----------------------------------------------------------------------
// Each id's shortest prefix that no other id shares, 8 characters at least (as git, and
// `reactor timers`): ids made in one millisecond share their first 12 (UUIDv7).
function shortIds(ids) {
  const sorted = [...ids].sort();
  const shown = new Map();
  sorted.forEach((id, index) => {
    let length = 8;
    for (const other of [sorted[index - 1], sorted[index + 1]]) {
      if (other === undefined) continue;
      let same = 0;
      while (same < id.length && id[same] === other[same]) same++;
      length = Math.max(length, same + 1);
    }
    shown.set(id, id.slice(0, length));
  });
  return shown;
}

// The pending timers, earliest first: when each is due (local time, and how soon),
// what it writes, its period; with --write, a button to cancel it.
async function loadTimers() {
  const result = await getJSON("timers");
  if (!result.ok) return;
  const now = Date.now();
  view.timerDeadlines = [];
  const shown = shortIds(result.body.timers.map((timer) => timer.id));
  const list = result.body.timers.map((timer) => {
    const row = document.createElement("tr");
    row.dataset.id = timer.id;
    const writes =
      timer.ops === null ? "set " + clip(timer.value, 60) : "update " + clip(timer.ops, 60);
    const id = cell(shown.get(timer.id));
    id.title = timer.id;
    row.append(
      cell(formatTime(timer.due * 1000)),
      cell(""),
      cell(timer.scope),
      cell(timer.key),
      cell(writes),
      cell(
        timer.cron
          ? "cron " + timer.cron + " (" + (timer.tz || "UTC") + ")"
          : timer.every === null
            ? "once"
            : "every " + formatSeconds(timer.every),
      ),
      id,
    );
    row.cells[4].title = timer.ops === null ? timer.value : timer.ops;
    if (view.writable) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "danger";
      button.textContent = "Cancel";
      button.title = "cancel this timer (asks first)";
      button.addEventListener("click", () => askCancelTimer(timer));
      const td = document.createElement("td");
      td.append(button);
      row.append(td);
    }
    view.timerDeadlines.push([row, now + timer.due_in * 1000]);
    return row;
  });
  rows($("timers"), list, "timers-empty");
  if (result.body.pending > list.length) {
    $("timers-empty").hidden = false;
    $("timers-empty").textContent = "and " + (result.body.pending - list.length) + " more";
  } else {
    $("timers-empty").textContent = "No timer pending.";
  }
  showTimersLeft();
}

// "in 12 s", counting down; a timer past due by more than the second it may take to
// fire is overdue (no process that writes has the database open).
function showTimersLeft() {
  const now = Date.now();
  for (const [row, deadline] of view.timerDeadlines) {
    const left = (deadline - now) / 1000;
    row.cells[1].textContent =
      left > 0 ? "in " + formatSeconds(left) : left > -2 ? "due" : "overdue " + formatSeconds(-left);
    row.classList.toggle("overdue", left <= -2);
  }
}

function showTimerFigures(figures) {
  if (!figures) return;
  $("timers-figures").textContent =
    figures.pending + " pending · fired here " + figures.fired + " · failed here " + figures.failed;
  $("timers-figures").className = figures.failed > 0 ? "muted bad" : "muted";
}

// Seconds as "0.5 s", "42 s", "29 min 59 s", "3 h 12 min", "2 d 3 h".
function formatSeconds(seconds) {
  if (seconds < 10) return String(Math.round(seconds * 10) / 10) + " s";
  if (seconds < 60) return Math.round(seconds) + " s";
  const units = [
    [86400, "d"],
    [3600, "h"],
    [60, "min"],
    [1, "s"],
  ];
  const whole = Math.round(seconds);
  const first = units.findIndex(([size]) => whole >= size);
  const [size, unit] = units[first];
  const [next, nextUnit] = units[first + 1];
  const rest = Math.floor((whole % size) / next);
  return Math.floor(whole / size) + " " + unit + (rest > 0 ? " " + rest + " " + nextUnit : "");
}

// Cancel asks first: the timer named now is the one cancelled on "Yes, cancel it".
function askCancelTimer(timer) {
  view.cancelling = timer;
  $("timer-question").textContent =
    "Cancel the timer " + timer.id + " (" + timer.scope + " / " + timer.key + ")?";
  $("timer-confirm").hidden = false;
  timersSay("", "");
  $("timer-no").focus();
}

function keepTimer() {
  view.cancelling = null;
  $("timer-confirm").hidden = true;
}

async function doCancelTimer() {
  const timer = view.cancelling;
  keepTimer();
  if (timer === null) return;
  const result = await post("cancel_timer", JSON.stringify({ id: timer.id }));
  if (result.ok) {
    timersSay("cancelled the timer " + timer.id, "ok");
  } else if (result.status === 404) {
    timersSay("the timer " + timer.id + " was no longer pending (it fired, or was cancelled)", "warn");
  } else {
    timersSay(errorText(result), "error");
  }
  await Promise.all([loadTimers(), loadStats()]);
}

function timersSay(text, kind) {
  $("timers-message").textContent = text;
  $("timers-message").className = "message " + (kind || "");
}

// -- queues ----------------------------------------------------------------------
// Every queue (up to 200): its jobs by state (as ``Queue.stats()`` counts them), its
// max_attempts, how long its first job in line has been ready; a click on its name
// shows its dead letters. With --write, a button per queue retries its dead letters.
async function loadQueues() {
  const result = await getJSON("queues");
  if (!result.ok) return;
  const now = Date.now();
  view.queueAges = [];
  const listed = result.body.queues;
  const list = listed.map((queue) => {
    const row = document.createElement("tr");
    row.dataset.queue = queue.name;
    row.className = queue.name === view.queue ? "selected" : "";
    const name = document.createElement("td");
    const pick = document.createElement("button");
    pick.type = "button";
    pick.className = "name";
    pick.textContent = queue.name;
    pick.title = "show its dead letters";
    pick.addEventListener("click", () => pickQueue(queue.name));
    name.append(pick);
    const age = cell("");
    row.append(
      name,
      cell(String(queue.ready)),
      cell(String(queue.delayed)),
      cell(String(queue.taken)),
      cell(String(queue.dead)),
      cell(String(queue.max_attempts)),
      cell(limitsText(queue)),
      age,
    );
    if (queue.dead > 0) row.cells[4].className = "bad";
    if (queue.oldest_ready_age !== null) {
      view.queueAges.push([age, now - queue.oldest_ready_age * 1000]);
    } else {
      age.textContent = "—";
    }
    if (view.writable) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "danger";
      button.textContent = "Retry dead letters";
      button.title = "make its dead letters ready again, attempts back to 0 (asks first)";
      button.disabled = queue.dead === 0;
      button.addEventListener("click", () => askRetry(queue));
      const td = document.createElement("td");
      td.append(button);
      row.append(td);
    }
    return row;
  });
  rows($("queues"), list, "queues-empty");
  const count = result.body.count;
  if (count > listed.length) {
    $("queues-empty").hidden = false;
    $("queues-empty").textContent = "and " + (count - listed.length) + " more";
  } else {
    $("queues-empty").textContent = "No queue.";
  }
  const partial = count > listed.length; // the dead letters of the queues listed only
  const dead = result.body.dead;
  view.queueTotals = { queues: count, dead, partial };
  $("queues-figures").textContent =
    count + (count === 1 ? " queue" : " queues") + " · " + dead + (partial ? "+" : "") +
    (dead === 1 && !partial ? " dead letter" : " dead letters");
  showQueueTotals();
  showQueueAges();
  if (view.queue !== null) loadDead();
}

// A queue's flow control and backoff, short: "≤10 taken · ≤1 a group · 100 in 60 s ·
// backoff 1–300 s"; "—" without any.
function limitsText(queue) {
  const parts = [];
  if (queue.concurrency !== null) parts.push("≤" + queue.concurrency + " taken");
  if (queue.group_concurrency !== null) parts.push("≤" + queue.group_concurrency + " a group");
  if (queue.rate !== null) parts.push(queue.rate[0] + " in " + queue.rate[1] + " s");
  if (queue.backoff !== null) parts.push("backoff " + queue.backoff[0] + "–" + queue.backoff[1] + " s");
  return parts.length === 0 ? "—" : parts.join(" · ");
}

// How long each queue's first job in line has been ready, counting up.
function showQueueAges() {
  const now = Date.now();
  for (const [age, since] of view.queueAges) age.textContent = formatSeconds(Math.max(0, now - since) / 1000);
}

// The stats panel's queue figures, from the last listing (the dead letters of the
// queues listed: "+" when there are more).
function showQueueTotals() {
  const totals = view.queueTotals;
  if (totals === null) return;
  const queues = $("stats").querySelector('dd[data-figure="queues"]');
  const dead = $("stats").querySelector('dd[data-figure="dead letters"]');
  if (queues) queues.textContent = String(totals.queues);
  if (dead) dead.textContent = totals.dead + (totals.partial ? "+" : "");
}

// A click on the queue shown closes its dead letters; on another, shows its.
function pickQueue(name) {
  view.queue = view.queue === name ? null : name;
  for (const row of $("queues").tBodies[0].rows) {
    row.className = row.dataset.queue === view.queue ? "selected" : "";
  }
  $("dead-letters").hidden = view.queue === null;
  view.job = null;
  $("job").hidden = true;
  keepJob();
  jobSay("", "");
  $("purge-dead").hidden = !view.writable;
  if (view.queue !== null) {
    $("dead-queue").textContent = view.queue;
    rows($("dead"), []);
    $("dead-note").textContent = "";
    loadDead();
  }
}

async function loadDead() {
  const name = view.queue;
  if (name === null) return;
  const state = $("jobs-state").value;
  const result = await getJSON("jobs", { queue: name, state, limit: DEAD_ROWS });
  if (view.queue !== name || $("jobs-state").value !== state) return; // picked another since
  $("jobs-title").firstChild.textContent = JOB_LISTS[state][0] + " ";
  $("jobs-when").textContent = JOB_LISTS[state][1];
  if (!result.ok) {
    rows($("dead"), []);
    $("dead-note").textContent = errorText(result);
    return;
  }
  const jobs = result.body.jobs;
  rows(
    $("dead"),
    jobs.map((job) => {
      const row = document.createElement("tr");
      row.dataset.id = String(job.id);
      const id = document.createElement("td");
      const open = document.createElement("button");
      open.type = "button";
      open.className = "name";
      open.textContent = String(job.id);
      open.title = "show this job";
      open.addEventListener("click", () => lookupJob(job.id));
      id.append(open);
      row.append(
        id,
        cell(clip(job.item, 100)),
        cell(String(job.attempts)),
        cell(formatTime(job.ready_at * 1000)),
        cell(job.error === null ? "—" : clip(lastLine(job.error), 100)),
      );
      row.cells[1].title = job.item; // all of it (up to 2,000 characters)
      if (job.error !== null) {
        row.cells[4].title = job.error; // a traceback, all of it (up to 2,000 characters)
        row.cells[4].className = "bad";
      }
      return row;
    }),
  );
  const total = result.body[state];
  if (jobs.length === 0) {
    $("dead-note").textContent = JOB_LISTS[state][2];
  } else if (total > jobs.length) {
    $("dead-note").textContent = "The first " + jobs.length + " of " + total + ", by " + JOB_LISTS[state][1] + ".";
  } else {
    $("dead-note").textContent = "";
  }
}

// A queue's jobs by state: [heading, what the time column says, what an empty list says].
const JOB_LISTS = {
  dead: ["Dead letters", "died", "No dead letter."],
  ready: ["Jobs ready or delayed", "ready at", "No job ready or delayed."],
  taken: ["Jobs taken", "lease ends", "No job taken."],
};

// The last non-empty line of an error: a traceback's says what was raised.
function lastLine(text) {
  const lines = text.split("\n").filter((line) => line.trim() !== "");
  return lines.length === 0 ? text : lines[lines.length - 1];
}

// Retry asks first: the queue named now is the one whose dead letters are retried.
function askRetry(queue) {
  view.retrying = queue;
  $("retry-question").textContent =
    "Retry the " + queue.dead + " dead letter" + (queue.dead === 1 ? "" : "s") + " of queue " +
    queue.name + "? They become ready again, attempts back to 0.";
  $("retry-confirm").hidden = false;
  queuesSay("", "");
  $("retry-no").focus();
}

function keepDead() {
  view.retrying = null;
  $("retry-confirm").hidden = true;
}

async function doRetry() {
  const queue = view.retrying;
  keepDead();
  if (queue === null) return;
  const result = await post("retry_dead", JSON.stringify({ queue: queue.name }));
  if (result.ok) {
    const count = result.body.retried;
    queuesSay(
      "retried " + count + " dead letter" + (count === 1 ? "" : "s") + " of " + queue.name,
      count > 0 ? "ok" : "warn",
    );
  } else {
    queuesSay(errorText(result), "error");
  }
  await loadQueues();
}

function queuesSay(text, kind) {
  $("queues-message").textContent = text;
  $("queues-message").className = "message " + (kind || "");
}

// -- a job, by id ------------------------------------------------------------------
// The queue picked above: look a job up by id (or click a dead letter's id), see its
// state, item, attempts and each failed attempt's error; with --write, cancel it, or
// purge the queue's dead letters (each asks first).
async function lookupJob(id) {
  const name = view.queue;
  if (name === null) return;
  $("job-id").value = String(id);
  const result = await getJSON("job", { queue: name, id: String(id) });
  if (view.queue !== name) return; // picked another since
  if (!result.ok) {
    view.job = null;
    $("job").hidden = true;
    jobSay(errorText(result), result.status === 404 ? "warn" : "error");
    return;
  }
  jobSay("", "");
  showJob(result.body);
}

function showJob(job) {
  view.job = job;
  $("job").hidden = false;
  $("job-where").textContent = job.queue + " #" + job.id;
  const fields = [
    ["state", job.state],
    ["item", job.item],
    ["attempts", job.attempts + " of " + job.max_attempts],
    ["priority", String(job.priority)],
    ["group", job.group === null ? "—" : job.group],
    ["key", job.key === null ? "—" : job.key],
    [job.state === "taken" ? "lease ends" : job.state === "dead" ? "died" : "ready at", formatTime(job.ready_at * 1000)],
    ["put", formatTime(job.created_at * 1000)],
  ];
  if (job.worker !== null) fields.push(["taken by", workerText(job.worker)]);
  $("job-fields").replaceChildren(
    ...fields.flatMap(([name, value]) => {
      const dt = document.createElement("dt");
      dt.textContent = name;
      const dd = document.createElement("dd");
      dd.textContent = value;
      if (name === "state" && value === "dead") dd.className = "bad";
      return [dt, dd];
    }),
  );
  rows(
    $("job-errors"),
    job.errors.map((error) => {
      const row = document.createElement("tr");
      row.append(
        cell(String(error.attempt)),
        cell(formatTime(error.at * 1000)),
        cell(error.worker ? workerText(error.worker) : "—"),
        errorCell(error.error),
      );
      return row;
    }),
  );
  $("job-errors").hidden = job.errors.length === 0;
  $("cancel-job").hidden = !view.writable;
}

// An attempt's error: its last line (what was raised), the whole traceback unfolded.
function errorCell(error) {
  const td = document.createElement("td");
  if (error === null) {
    td.textContent = "—";
    return td;
  }
  const details = document.createElement("details");
  const summary = document.createElement("summary");
  summary.textContent = clip(lastLine(error), 120);
  const trace = document.createElement("pre");
  trace.className = "traceback";
  trace.textContent = error;
  details.append(summary, trace);
  td.className = "bad";
  td.append(details);
  return td;
}

// Show job ``id`` of queue ``name`` (a click in the feed): its queue's jobs, then it.
async function openJob(name, id) {
  if (view.queue !== name) pickQueue(name);
  await lookupJob(id);
  $("job").scrollIntoView({ block: "nearest" });
}

// A change of a queue's job (scope queue:NAME, key: its id) or of a run: its key opens it.
function openableJob(row, event) {
  const key = row.cells[3];
  let open = null;
  if (event.scope.startsWith("queue:") && /^[0-9]+$/.test(event.key)) {
    open = () => openJob(event.scope.slice("queue:".length), Number(event.key));
  } else if (event.scope.startsWith("run:")) {
    // A run is key ID of scope run:WORKFLOW (and of the index, scope run:).
    open = () => {
      pickRun(event.key); // runs.js
      $("run").scrollIntoView({ block: "nearest" });
    };
  }
  if (open === null) return;
  const button = document.createElement("button");
  button.type = "button";
  button.className = "name";
  button.textContent = event.key;
  button.title = "show this " + (event.scope.startsWith("queue:") ? "job" : "run");
  button.addEventListener("click", open);
  key.replaceChildren(button);
}

function workerText(worker) {
  return worker.host + " pid " + worker.pid + " " + worker.thread;
}

function askJobAction(kind) {
  const name = view.queue;
  if (name === null) return;
  if (kind === "cancel") {
    if (view.job === null) return;
    view.jobAction = { kind, queue: view.job.queue, id: view.job.id };
    $("job-question").textContent =
      "Cancel job " + view.job.id + " of queue " + view.job.queue + " (" + view.job.state + ")? It is removed.";
  } else {
    view.jobAction = { kind, queue: name, id: null };
    $("job-question").textContent = "Purge the dead letters of queue " + name + "? They are removed.";
  }
  $("job-confirm").hidden = false;
  $("job-no").focus();
}

function keepJob() {
  view.jobAction = null;
  $("job-confirm").hidden = true;
}

async function doJobAction() {
  const action = view.jobAction;
  keepJob();
  if (action === null) return;
  if (action.kind === "cancel") {
    const result = await post("cancel_job", JSON.stringify({ queue: action.queue, id: action.id }));
    if (result.ok) {
      view.job = null;
      $("job").hidden = true;
      jobSay("cancelled job " + action.id + " of " + action.queue, "ok");
    } else {
      jobSay(errorText(result), result.status === 404 ? "warn" : "error");
    }
  } else {
    const result = await post("purge", JSON.stringify({ queue: action.queue, state: "dead" }));
    if (result.ok) {
      const count = result.body.purged;
      jobSay("purged " + count + " dead letter" + (count === 1 ? "" : "s") + " of " + action.queue, count > 0 ? "ok" : "warn");
    } else {
      jobSay(errorText(result), "error");
    }
  }
  await loadQueues();
}

function jobSay(text, kind) {
  $("job-message").textContent = text;
  $("job-message").className = "message " + (kind || "");
}

// -- a key's history ---------------------------------------------------------------
async function loadHistory() {
  if (view.scope === null || view.key === null) return;
  const where = { scope: view.scope, key: view.key };
  const result = await getJSON("history", { ...where, limit: HISTORY_ROWS });
  if (view.scope !== where.scope || view.key !== where.key) return; // picked another since
  $("history-panel").hidden = false;
  $("history-where").textContent = where.scope + " / " + where.key;
  if (!result.ok) {
    rows($("history"), []);
    $("history-note").textContent = errorText(result);
    return;
  }
  const changes = result.body.changes;
  rows(
    $("history"),
    changes.map((event) =>
      changeRow(event, [event.version === null ? "" : "v" + event.version, formatTime(event.timestamp)]),
    ),
  );
  const compacted = result.body.compacted;
  const oldest = changes.length ? changes[changes.length - 1].revision : null;
  if (changes.length >= HISTORY_ROWS) {
    $("history-note").textContent = "The last " + changes.length + " changes.";
  } else if (compacted > 0 && (oldest === null || oldest > compacted + 1)) {
    $("history-note").textContent =
      "The change log before #" + (compacted + 1) + " is compacted: older changes are not shown.";
  } else {
    $("history-note").textContent = changes.length ? "" : "No change in the log.";
  }
}

// A time (ISO text, or ms since the epoch) as local time.
function formatTime(when) {
  const at = new Date(when);
  const two = (n) => String(n).padStart(2, "0");
  return (
    at.getFullYear() + "-" + two(at.getMonth() + 1) + "-" + two(at.getDate()) + " " +
    two(at.getHours()) + ":" + two(at.getMinutes()) + ":" + two(at.getSeconds())
  );
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
  const body = $("feed").tBodies[0];
  const row = changeRow(event, [event.scope, event.key]);
  if (isInternal(event.scope)) openableJob(row, event); // before the time cell goes in
  const at = new Date(event.timestamp);
  const time = cell(formatClock(at));
  time.className = "time";
  time.title = formatTime(at) + " (local time) · " + event.timestamp;
  row.prepend(time);
  row.dataset.type = event.type;
  row.dataset.internal = isInternal(event.scope) ? "1" : "";
  row.hidden = !feedShows(row);
  body.prepend(row);
  while (body.rows.length > FEED_ROWS) body.deleteRow(-1);
  showFeedNote();
}

// The scopes reactor keeps its own work in: a queue's jobs, a workflow's runs.
function isInternal(scope) {
  return scope.startsWith("queue:") || scope.startsWith("run:");
}

// Whether the feed's filters (type, queue and run scopes) show this row.
function feedShows(row) {
  const type = $("feed-type").value;
  if (type && row.dataset.type !== type) return false;
  return $("feed-internal").checked || row.dataset.internal !== "1";
}

function filterFeed() {
  for (const row of $("feed").tBodies[0].rows) row.hidden = !feedShows(row);
  showFeedNote();
}

// How many changes the filters hide, so that a quiet feed is not mistaken for an idle one.
function showFeedNote() {
  const all = $("feed").tBodies[0].rows;
  let hidden = 0;
  for (const row of all) if (row.hidden) hidden += 1;
  $("feed-note").textContent =
    hidden === 0 ? "" : hidden + " of the last " + all.length + " changes hidden by the filters";
}

// A time as "12:03:04", local time.
function formatClock(when) {
  const two = (n) => String(n).padStart(2, "0");
  return two(when.getHours()) + ":" + two(when.getMinutes()) + ":" + two(when.getSeconds());
}

// A change as a table row: its revision, type, the ``middle`` cells, and what changed.
function changeRow(event, middle) {
  const row = document.createElement("tr");
  row.className = "event " + event.type;
  row.dataset.revision = String(event.revision);
  const type = cell(event.type);
  type.className = "type";
  if (event.timer) {
    // Written by a timer (its write, as scheduled): the id on hover.
    const badge = document.createElement("span");
    badge.className = "tag timer";
    badge.textContent = "timer";
    badge.title = "written by the timer " + event.timer;
    type.append(badge);
    row.dataset.timer = event.timer;
  }
  row.append(cell("#" + event.revision), type, ...middle.map(cell));
  const what = document.createElement("td");
  what.className = "change";
  for (const line of changeLines(event)) {
    const div = document.createElement("div");
    div.textContent = line;
    what.append(div);
  }
  what.title = (event.old_text ?? "∅") + " → " + (event.new_text ?? "∅");
  row.append(what);
  return row;
}

// What a change did, in lines: the value a key got or lost, or an update's patch
// (``replace /total 99 → 100.0``).
function changeLines(event) {
  if (event.type === "created") return [clip(event.new_text)];
  if (event.type === "deleted" || event.type === "expired") return ["was " + clip(event.old_text)];
  if (!event.diff) return [clip(event.old_text, 60) + " → " + clip(event.new_text, 60)];
  if (event.diff.ops.length === 0) return ["the same values, keys in another order"];
  const lines = event.diff.ops.slice(0, 8).map((op) => {
    const path = op.path === "" ? "(whole value)" : op.path;
    switch (op.op) {
      case "replace":
        return "replace " + path + " " + clip(op.old, 40) + " → " + clip(op.value, 40);
      case "add":
        return "add " + path + " " + clip(op.value, 60);
      case "remove":
        return "remove " + path + " (was " + clip(op.old, 60) + ")";
      default: // move, copy
        return op.op + " " + op.from + " → " + path;
    }
  });
  const more = event.diff.ops.length - lines.length + event.diff.more;
  if (more > 0) lines.push("… and " + more + " more");
  return lines;
}

// A change may concern what is on show: refresh it a little later, once for a burst
// (when it settles, or a second after it began if it goes on: a queue worked steadily).
function changed(event) {
  const pending = view.pending;
  pending.keys ||= event.scope === view.scope;
  pending.value ||= event.scope === view.scope && event.key === view.key;
  pending.queues ||= event.scope.startsWith("queue:"); // a job's change (key: its id)
  pending.runs ||= event.scope.startsWith("run:"); // a run's change (key: its id)
  const now = Date.now();
  if (view.refreshFirst === null) view.refreshFirst = now;
  clearTimeout(view.refreshTimer);
  view.refreshTimer = setTimeout(() => {
    view.pending = { keys: false, value: false, queues: false, runs: false };
    view.refreshFirst = null;
    loadScopes();
    loadStats();
    loadLocks();
    loadTimers(); // a timer that fired is gone (or, recurring, moved on)
    loadDerived();
    if (pending.queues) loadQueues();
    if (pending.runs) loadRuns();
    if (pending.keys) loadKeys();
    if (pending.value) {
      loadValue(false);
      loadHistory();
    }
  }, Math.max(0, Math.min(SETTLE_MS, view.refreshFirst + BURST_MS - now)));
}

// -- writes ----------------------------------------------------------------------
function target() {
  return { scope: $("edit-scope").value, key: $("edit-key").value };
}

function targetJSON(where) {
  return '"scope":' + JSON.stringify(where.scope) + ',"key":' + JSON.stringify(where.key);
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

// ``done`` says what the write did: a text, or [text, kind] (kind "ok" by default).
async function afterWrite(result, where, done) {
  if (!result.ok) {
    show(errorText(result), "error");
    return;
  }
  const said = done(result.body);
  const [text, kind] = Array.isArray(said) ? said : [said, "ok"];
  show(text, kind);
  view.scope = where.scope;
  view.key = where.key;
  $("keys-scope").textContent = view.scope;
  await Promise.all([loadScopes(), loadKeys(), loadValue(false), loadStats(), loadHistory()]);
}

async function doSet() {
  cancelDelete();
  const text = $("edit-value").value.trim();
  if (!checkedJSON(text, "the value")) return;
  const ttl = $("edit-ttl").value.trim();
  let options = "";
  if (ttl) options = ',"ttl":' + Number(ttl);
  else if ($("edit-keep-ttl").checked) options = ',"keep_ttl":true';
  // The value text goes in as the user typed it (checked above to be one JSON value).
  const where = target();
  const body = "{" + targetJSON(where) + ',"value":' + text + options + "}";
  await afterWrite(await post("set", body), where, () => "saved");
}

async function doUpdate() {
  cancelDelete();
  let text = $("edit-ops").value.trim();
  if (!checkedJSON(text, "the ops")) return;
  if (!text.startsWith("[")) text = "[" + text + "]"; // one op alone
  const atomic = $("edit-atomic").checked;
  const where = target();
  const body = "{" + targetJSON(where) + ',"ops":' + text + ',"atomic":' + atomic + "}";
  await afterWrite(await post("update", body), where, updateOutcome);
}

// An update with errors is a failure: nothing written ("none"), or only some ops.
function updateOutcome(data) {
  if (data.errors.length === 0) return "updated";
  const errors = data.errors.map(
    (error) => "op " + error.index + " (" + error.code + "): " + error.message,
  );
  if (data.applied === "none") {
    return [["not updated: nothing was written", ...errors].join("\n"), "error"];
  }
  const count = data.errors.length + " op(s) did not apply, the others did";
  return [["updated in part: " + count, ...errors].join("\n"), "warn"];
}

// Delete asks first: the key named now is the one deleted on "Yes, delete".
function askDelete() {
  const where = target();
  if (!where.scope || !where.key) {
    show("to delete, name a scope and a key", "error");
    return;
  }
  view.deleting = where;
  $("delete-question").textContent = "Delete " + where.key + " from " + where.scope + "?";
  $("delete-confirm").hidden = false;
  show("", "");
  $("delete-no").focus();
}

function cancelDelete() {
  view.deleting = null;
  $("delete-confirm").hidden = true;
}

async function doDelete() {
  const where = view.deleting;
  cancelDelete();
  if (where === null) return;
  await afterWrite(await post("delete", "{" + targetJSON(where) + "}"), where, (data) =>
    data.deleted ? "deleted" : ["there was no such key", "warn"],
  );
}

// -- start -----------------------------------------------------------------------
function start() {
  $("key-pattern").addEventListener("input", () => loadKeys());
  $("feed-type").addEventListener("change", filterFeed);
  $("feed-internal").addEventListener("change", filterFeed);
  $("feed-filter").addEventListener("submit", (event) => {
    event.preventDefault();
    follow(true);
  });
  $("do-set").addEventListener("click", doSet);
  $("do-update").addEventListener("click", doUpdate);
  $("do-delete").addEventListener("click", askDelete);
  $("delete-yes").addEventListener("click", doDelete);
  $("delete-no").addEventListener("click", () => {
    cancelDelete();
    show("not deleted", "");
  });
  $("delete-confirm").addEventListener("keydown", (event) => {
    if (event.key === "Escape") $("delete-no").click();
  });
  $("timer-yes").addEventListener("click", doCancelTimer);
  $("timer-no").addEventListener("click", () => {
    keepTimer();
    timersSay("not cancelled", "");
  });
  $("timer-confirm").addEventListener("keydown", (event) => {
    if (event.key === "Escape") $("timer-no").click();
  });
  $("retry-yes").addEventListener("click", doRetry);
  $("retry-no").addEventListener("click", () => {
    keepDead();
    queuesSay("not retried", "");
  });
  $("retry-confirm").addEventListener("keydown", (event) => {
    if (event.key === "Escape") $("retry-no").click();
  });
  $("job-lookup").addEventListener("submit", (event) => {
    event.preventDefault();
    const id = $("job-id").value.trim();
    if (/^[0-9]+$/.test(id)) lookupJob(Number(id));
  });
  $("jobs-state").addEventListener("change", () => {
    rows($("dead"), []);
    loadDead();
  });
  $("cancel-job").addEventListener("click", () => askJobAction("cancel"));
  $("purge-dead").addEventListener("click", () => askJobAction("purge"));
  $("job-yes").addEventListener("click", doJobAction);
  $("job-no").addEventListener("click", () => {
    keepJob();
    jobSay("nothing changed", "");
  });
  $("job-confirm").addEventListener("keydown", (event) => {
    if (event.key === "Escape") $("job-no").click();
  });
  loadInfo();
  loadScopes();
  loadStats();
  loadLocks();
  loadTimers();
  loadQueues();
  startCharts(); // charts.js
  startRuns(); // runs.js
  loadDerived(); // derived.js
  follow(true);
  setInterval(() => {
    showTTL();
    showLocksLeft();
    showTimersLeft();
    showQueueAges();
  }, 1000);
  setInterval(() => {
    loadScopes();
    loadStats();
    loadLocks();
    loadTimers();
    loadQueues();
    loadDerived();
  }, REFRESH_MS);
}

document.addEventListener("DOMContentLoaded", start);
