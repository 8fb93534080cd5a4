// reactor ui: the charts of the last hour (writes and events per second, queue depths,
// the durable subscribers' lag, the timers' lag), drawn by uPlot (static/vendor/uplot,
// MIT) from GET api/series, which the server samples every few seconds. Uses app.js's
// helpers ($, getJSON, formatSeconds).
"use strict";

const CHART_HEIGHT = 170;
const CHART_SPAN_MIN = 300; // seconds the time axis spans at least
const COLORS = ["#2f6fde", "#d9480f", "#2b8a3e", "#ae3ec9", "#e8590c", "#1098ad", "#5c940d", "#c2255c", "#495057", "#f08c00", "#3b5bdb", "#0ca678"];

// Each chart: its element, its title, its unit, and its series from an answer of
// api/series: [name, values] pairs.
const CHARTS = [
  {
    id: "chart-writes",
    title: "Writes and events per second",
    unit: "/s",
    dashed: ["events/s"], // often on the writes' line: both show
    series: (data) => [
      ["writes/s", data.writes],
      ["events/s", data.events],
    ],
  },
  {
    id: "chart-queues",
    title: "Queue depths (jobs ready or delayed)",
    unit: "jobs",
    series: (data) => Object.entries(data.queues),
    empty: "No queue.",
  },
  {
    id: "chart-lag",
    title: "Durable subscribers' lag (revisions behind)",
    unit: "revisions",
    series: (data) => Object.entries(data.lag),
    empty: "No durable subscriber.",
  },
  {
    id: "chart-timers",
    title: "Timer lag (how long the oldest due timer has waited)",
    unit: "s",
    series: (data) => [["timer lag", data.timer_lag]],
  },
];

const chartsView = { plots: {}, names: {}, timer: null, interval: 5 };

async function loadSeries() {
  const result = await getJSON("series");
  if (!result.ok) return;
  const data = result.body;
  chartsView.interval = data.interval;
  for (const chart of CHARTS) drawChart(chart, data);
}

// (Re)draw one chart: made again when its series change (a queue appears), else fed.
function drawChart(chart, data) {
  const series = chart.series(data);
  const names = series.map(([name]) => name).join("\n");
  const values = [data.t, ...series.map(([, list]) => list)];
  const box = $(chart.id);
  let plot = chartsView.plots[chart.id];
  if (plot && chartsView.names[chart.id] !== names) {
    plot.destroy();
    plot = null;
  }
  if (plot) {
    plot.setData(values);
  } else {
    const holder = box.querySelector(".plot");
    holder.replaceChildren();
    chartsView.plots[chart.id] = new uPlot(chartOptions(chart, series, holder), values, holder);
    chartsView.names[chart.id] = names;
  }
  box.querySelector(".now").textContent = latest(chart, series, data);
}

function chartOptions(chart, series, holder) {
  return {
    width: Math.max(240, holder.clientWidth),
    height: CHART_HEIGHT,
    cursor: { drag: { x: false, y: false } },
    legend: { live: true },
    scales: {
      // At least the last 5 minutes, so that a first sample or two are not spread over years.
      x: { time: true, range: (_plot, min, max) => timeRange(min, max) },
      y: { range: (_plot, _min, max) => [0, Math.max(1, (max || 0) * 1.1)] },
    },
    axes: [{ stroke: "#888" }, { stroke: "#888", size: 56 }],
    series: [
      { label: "time" },
      ...series.map(([name], index) => ({
        label: name,
        stroke: COLORS[index % COLORS.length],
        width: 1.5,
        dash: (chart.dashed || []).includes(name) ? [6, 4] : undefined,
        spanGaps: false,
        value: (_plot, value) => (value === null || value === undefined ? "—" : formatFigure(value, chart.unit)),
      })),
    ],
  };
}

function timeRange(min, max) {
  const end = max === null || max === undefined ? Date.now() / 1000 : max;
  const start = min === null || min === undefined ? end : min;
  return [Math.min(start, end - CHART_SPAN_MIN), end];
}

// The last sample's figures, in words: "now 3.2 writes/s · 0 events/s".
function latest(chart, series, data) {
  if (data.t.length === 0) return "no sample yet: the first comes within " + formatSeconds(data.interval);
  if (series.length === 0) return chart.empty || "";
  const last = data.t.length - 1;
  const parts = series.map(([name, list]) => {
    const value = list[last];
    return name + " " + (value === null || value === undefined ? "—" : formatFigure(value, chart.unit));
  });
  return "now: " + parts.join(" · ");
}

function formatFigure(value, unit) {
  if (unit === "s") return formatSeconds(value);
  const shown = Number.isInteger(value) ? String(value) : value.toFixed(value < 10 ? 2 : 1);
  return unit === "/s" ? shown : shown + " " + unit;
}

// Sized to their boxes, again when the window's width changes.
function resizeCharts() {
  for (const chart of CHARTS) {
    const plot = chartsView.plots[chart.id];
    if (plot) plot.setSize({ width: Math.max(240, $(chart.id).querySelector(".plot").clientWidth), height: CHART_HEIGHT });
  }
}

function startCharts() {
  const panel = $("charts");
  panel.replaceChildren(
    ...CHARTS.map((chart) => {
      const box = document.createElement("figure");
      box.id = chart.id;
      box.className = "chart";
      const caption = document.createElement("figcaption");
      caption.textContent = chart.title;
      const plot = document.createElement("div");
      plot.className = "plot";
      const now = document.createElement("p");
      now.className = "now muted";
      box.append(caption, plot, now);
      return box;
    }),
  );
  loadSeries();
  // As often as the server samples (at least every 2 s, at most every 30 s).
  const every = () => Math.min(30, Math.max(2, chartsView.interval)) * 1000;
  const tick = async () => {
    await loadSeries();
    chartsView.timer = setTimeout(tick, every());
  };
  chartsView.timer = setTimeout(tick, every());
  let resizing = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(resizeCharts, 150);
  });
}
