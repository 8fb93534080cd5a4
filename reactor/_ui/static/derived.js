// reactor ui: the derived values panel (SPEC §15). Uses app.js's helpers
// ($, getJSON, cell, rows, clip, errorText).
"use strict";

// The derived values live in the dashboard's process, by name; a last error in red.
async function loadDerived() {
  const result = await getJSON("derived", {});
  if (!result.ok) {
    $("derived-figures").textContent = errorText(result);
    return;
  }
  const list = result.body.derived.map((value) => {
    const row = document.createElement("tr");
    row.append(
      cell(value.name),
      cell(clip(value.value, 100)),
      cell(String(value.revision)),
      cell(String(value.recomputations)),
      cell(value.error === null ? "" : clip(value.error, 100)),
    );
    if (value.error !== null) row.cells[4].className = "bad";
    return row;
  });
  rows($("derived"), list, "derived-empty");
  const count = result.body.derived.length;
  $("derived-figures").textContent = count ? count + (count === 1 ? " live" : " live") : "";
}
