// reactor ui: the durable workflows' runs panel (SPEC §14). Uses app.js's helpers
// ($, getJSON, post, cell, rows, clip, formatTime, formatSeconds, view, errorText).
"use strict";

const runsView = {
  run: null, // the id of the run shown
  cancelling: false, // the page asks whether to cancel the run shown
};

const FINAL = ["succeeded", "failed", "cancelled"];

// Every run changed lately (newest first, up to 200): failed ones in red, cancelled in
// amber, runs taken again after a worker died (attempts > 1) marked.
async function loadRuns() {
  const params = { workflow: $("runs-workflow").value || "*" };
  if ($("runs-status").value) params.status = $("runs-status").value;
  const result = await getJSON("runs", params);
  if (!result.ok) {
    $("runs-figures").textContent = errorText(result);
    return;
  }
  const { runs, count, failed } = result.body;
  const list = runs.map((run) => {
    const row = document.createElement("tr");
    row.className = run.id === runsView.run ? "selected" : "";
    const pick = document.createElement("button");
    pick.type = "button";
    pick.className = "name";
    pick.textContent = run.id;
    pick.addEventListener("click", () => pickRun(run.id));
    const first = document.createElement("td");
    first.append(pick);
    row.append(
      first,
      cell(run.workflow),
      cell(run.status),
      cell(String(run.attempts)),
      cell(String(run.steps)),
      cell(formatTime(run.updated * 1000)),
      cell(run.error === null ? "" : clip(run.error.type + ": " + run.error.message, 100)),
    );
    row.cells[2].className = statusClass(run.status);
    if (run.attempts > 1) row.cells[3].className = "warn";
    if (run.error !== null) row.cells[6].className = "bad";
    return row;
  });
  rows($("runs"), list, "runs-empty");
  $("runs-figures").textContent =
    count + (count === 1 ? " run" : " runs") + (failed ? " · " + failed + " failed" : "");
  $("runs-figures").className = failed ? "muted bad" : "muted";
  if (runsView.run !== null) loadRun();
}

function statusClass(status) {
  if (status === "failed") return "bad";
  if (status === "cancelled") return "warn";
  if (status === "succeeded") return "good";
  return "";
}

function pickRun(id) {
  runsView.run = id;
  runsView.cancelling = false;
  $("run-confirm").hidden = true;
  $("run-message").textContent = "";
  for (const row of $("runs").tBodies[0].rows) {
    row.className = row.cells[0].textContent === id ? "selected" : "";
  }
  loadRun();
}

// A run's fields, and its steps on a timeline: each bar starts and ends where the step
// did, on the span from the run's start to its last change (or now, while it goes on).
async function loadRun() {
  const id = runsView.run;
  const result = await getJSON("run", { id });
  if (id !== runsView.run) return; // another was picked meanwhile
  $("run").hidden = false;
  if (!result.ok) {
    $("run-where").textContent = id;
    $("run-fields").replaceChildren();
    rows($("run-steps"), []);
    $("run-message").textContent = errorText(result);
    return;
  }
  const run = result.body;
  $("run-where").textContent = run.id + " · " + run.workflow;
  const fields = [
    ["status", run.status],
    ["attempts", String(run.attempts)],
    ["input", clip(run.input, 200)],
    ["started", formatTime(run.created * 1000)],
    ["updated", formatTime(run.updated * 1000)],
  ];
  if (run.status === "succeeded") fields.push(["result", clip(run.result, 200)]);
  if (run.error !== null) fields.push(["error", run.error.type + ": " + run.error.message]);
  $("run-fields").replaceChildren(
    ...fields.flatMap(([name, value]) => {
      const dt = document.createElement("dt");
      dt.textContent = name;
      const dd = document.createElement("dd");
      dd.textContent = value;
      if ((name === "status" && value === "failed") || name === "error") dd.className = "bad";
      return [dt, dd];
    }),
  );
  const begin = run.created;
  const end = FINAL.includes(run.status) ? run.updated : Date.now() / 1000;
  const span = Math.max(end - begin, 0.001);
  rows(
    $("run-steps"),
    run.steps.map((step, number) => {
      const row = document.createElement("tr");
      const ended = step.ended === null ? end : step.ended;
      const took = step.ended === null ? "…" : formatSeconds(step.ended - step.started);
      const bar = document.createElement("div");
      bar.className = "bar " + (step.status === "failed" ? "bad" : step.status === "waiting" ? "waiting" : "good");
      bar.style.marginLeft = (100 * Math.max(0, step.started - begin)) / span + "%";
      bar.style.width = Math.max(0.5, (100 * (ended - step.started)) / span) + "%";
      bar.title = step.name + ": " + took;
      const timeline = document.createElement("td");
      timeline.className = "timeline";
      timeline.append(bar);
      const outcome = step.error !== null ? step.error.type + ": " + step.error.message : clip(step.result, 100);
      row.append(cell(String(number)), cell(step.name), cell(step.status), cell(took), timeline, cell(outcome));
      row.cells[2].className = statusClass(step.status);
      if (step.error !== null) row.cells[5].className = "bad";
      return row;
    }),
  );
  $("cancel-run").hidden = !view.writable || FINAL.includes(run.status);
}

async function cancelRun() {
  const id = runsView.run;
  $("run-confirm").hidden = true;
  const result = await post("cancel_run", JSON.stringify({ id }));
  $("run-message").textContent = result.ok
    ? result.body.cancelled ? "cancelled " + id : id + " had ended already"
    : errorText(result);
  await loadRuns();
}

function startRuns() {
  $("runs-filter").addEventListener("submit", (event) => {
    event.preventDefault();
    loadRuns();
  });
  $("runs-status").addEventListener("change", () => loadRuns());
  $("cancel-run").addEventListener("click", () => {
    $("run-question").textContent = "Cancel run " + runsView.run + " (and its children)?";
    $("run-confirm").hidden = false;
    $("run-yes").focus();
  });
  $("run-yes").addEventListener("click", cancelRun);
  $("run-no").addEventListener("click", () => {
    $("run-confirm").hidden = true;
    $("run-message").textContent = "nothing changed";
  });
  loadRuns();
}
