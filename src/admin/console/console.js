// The vq-gateway operator console: reads /console/state every tick, draws each sale's last ten
// minutes, and sends an operator's changes to the admin API with the admin token. The token is
// kept in this page's memory only (never in storage, never in the URL). Data from the server is
// put into the page as text, never as markup.
"use strict";

const HISTORY_MS = 10 * 60 * 1000;
const COLORS = { waiting: "#0a58ca", admitted: "#116329", budget: "#8a4b00", evicted: "#b42318" };

let token = null;
let lastTickAt = 0;
let serverNow = 0;
let pollTimer = null;
const sales = new Map(); // key -> { view, ticks, sale }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "text") node.textContent = value;
    else if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
}

const number = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"));
const users = (n) => (n === null || n === undefined ? "—" : `${number(n)} ${n === 1 ? "user" : "users"}`);
const perSecond = (n) => (n === null || n === undefined ? "—" : `${Number(n).toLocaleString("en-US", { maximumFractionDigits: 1 })} users/s`);

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return s % 60 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${s / 60} min`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

function ago(ms) {
  return ms < 1000 ? "just now" : `${duration(ms / 1000)} ago`;
}

function when(epochMs) {
  return epochMs ? new Date(epochMs).toLocaleString() : "—";
}

function say(text, kind) {
  const box = document.getElementById("message");
  box.textContent = text;
  box.className = `message ${kind || ""}`;
  box.hidden = false;
}

// A modal question: resolves true only when the operator confirms.
function confirmFirst(question) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = question;
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
    document.getElementById("confirm-cancel").focus();
  });
}

// A write through the admin API. Says what happened; true when the gateway took the change.
async function write(method, path, body, done) {
  if (!token) {
    say("Enter the admin token first: nothing was changed.", "error");
    return false;
  }
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
  } catch (e) {
    say(`The gateway could not be reached: nothing was changed (${e}).`, "error");
    return false;
  }
  if (response.ok) {
    say(done, "ok");
    poll();
    return true;
  }
  let detail = "";
  try {
    const answer = await response.json();
    detail = answer.detail || answer.code || "";
  } catch (e) {
    detail = response.statusText;
  }
  const why = response.status === 401
    ? "the admin token was refused"
    : response.status === 403 ? "admin writes are off on this gateway" : detail;
  say(`Refused (${response.status}): ${why}. Nothing was changed.`, "error");
  return false;
}

function salePath(sale) {
  return `/sales/${sale.type}/${sale.id}`;
}

function figure(label) {
  const value = el("dd", { text: "—" });
  return { node: el("div", {}, el("dt", { text: label }), value), value };
}

function chart(title, legend) {
  const canvas = el("canvas", { role: "img", "aria-label": title });
  const keys = el("div", { class: "legend", "aria-hidden": "true" });
  for (const [name, color] of legend) {
    const swatch = el("i");
    swatch.style.background = color;
    keys.append(el("span", {}, swatch, name));
  }
  return { node: el("figure", { class: "chart" }, el("figcaption", { text: title }), canvas, keys), canvas };
}

function numberInput(id, label, min) {
  const input = el("input", { id, type: "number", min: String(min), step: "1", required: "" });
  return { label: el("label", { for: id, text: label }), input };
}

// The card of one sale, built once and updated in place (inputs being edited stay untouched).
function saleView(sale) {
  const key = sale.key;
  const slug = key.replace(/[^A-Za-z0-9]/g, "-");
  const state = el("span", { class: "badge" });
  const queue = el("span", { class: "badge" });
  const f = {
    waiting: figure("Waiting"),
    admitted: figure("Admitted so far"),
    rate: figure("Admission rate"),
    budget: figure("Budget"),
    eta: figure("Last user admitted in"),
    capacity: figure("Capacity used"),
    lastTick: figure("Last tick"),
    evicted: figure("Evicted (10 min)"),
  };
  const figures = el("dl", { class: "figures" }, ...Object.values(f).map((x) => x.node));
  const waitingChart = chart("Users waiting (up to the last 10 minutes)", [["waiting", COLORS.waiting]]);
  const tickChart = chart("Admissions per tick against the budget, and evictions (up to the last 10 minutes)",
    [["admitted", COLORS.admitted], ["budget", COLORS.budget], ["evicted", COLORS.evicted]]);
  const draw = el("p", { class: "draw" });

  const batch = numberInput(`batch-${slug}`, "Budget (users per tick)", 1);
  const tick = numberInput(`tick-${slug}`, "Tick (ms)", 100);
  const capacity = numberInput(`capacity-${slug}`, "Capacity (users)", 1);
  const budgetForm = el("form", { class: "row", "aria-label": `Budget of ${key}` },
    batch.label, batch.input, tick.label, tick.input, capacity.label, capacity.input,
    el("button", { type: "submit", "data-action": "budget", text: "Apply" }));
  budgetForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const current = sales.get(key).sale;
    write("PUT", salePath(current), {
      batchSize: Number(batch.input.value),
      tickMs: Number(tick.input.value),
      maxCapacity: Number(capacity.input.value),
    }, `${key}: budget ${batch.input.value} users per ${tick.input.value} ms tick, capacity ${capacity.input.value} users.`);
  });
  const pause = el("button", { type: "button", class: "danger", "data-action": "pause" });
  pause.addEventListener("click", async () => {
    const current = sales.get(key).sale;
    if (current.state === "paused") {
      write("PUT", salePath(current), { state: "open" }, `${key} resumed: admissions go on at the next tick.`);
    } else if (await confirmFirst(`Pause ${key}? Nobody is admitted until it resumes; everyone keeps their place.`)) {
      write("PUT", salePath(current), { state: "paused" }, `${key} paused: no admissions from the next tick.`);
    }
  });
  const queueSwitch = el("button", { type: "button", class: "secondary", "data-action": "queue" });
  queueSwitch.addEventListener("click", async () => {
    const current = sales.get(key).sale;
    if (current.queue === "off") {
      write("PUT", "/flag", { target: key, enabled: true }, `The queue is on for ${key}.`);
    } else if (await confirmFirst(`Switch the queue off for ${key}? Its users then reach the backend without waiting, at any rate.`)) {
      write("PUT", "/flag", { target: key, enabled: false }, `The queue is off for ${key}.`);
    }
  });

  const card = el("article", { class: "sale", id: `sale-${slug}`, "aria-labelledby": `title-${slug}` },
    el("header", {}, el("h3", { id: `title-${slug}`, text: `${sale.type} ${sale.id}` }), state, queue),
    figures,
    el("div", { class: "charts" }, waitingChart.node, tickChart.node),
    budgetForm,
    el("div", { class: "row" }, pause, queueSwitch),
    draw);
  batch.input.value = sale.batchSize;
  tick.input.value = sale.tickMs;
  capacity.input.value = sale.maxCapacity;
  return { card, state, queue, f, waitingChart, tickChart, draw, pause, queueSwitch, inputs: [batch, tick, capacity] };
}

function updateSale(entry) {
  const { view, sale, ticks } = entry;
  view.state.textContent = sale.state === "paused" ? "paused" : "open";
  view.state.className = `badge ${sale.state}`;
  view.queue.textContent = `queue ${sale.queue}`;
  view.queue.className = `badge ${sale.queue}`;
  view.f.waiting.value.textContent = users(sale.waitingCount);
  view.f.admitted.value.textContent = users(sale.admittedCount);
  view.f.rate.value.textContent = perSecond(sale.admissionRatePerSec);
  view.f.budget.value.textContent = `${users(sale.batchSize)} per ${number(sale.tickMs)} ms tick (${perSecond(sale.budgetPerSec)})`;
  view.f.eta.value.textContent = sale.state === "paused" ? "paused" : duration(sale.etaLastUserS);
  view.f.capacity.value.textContent = sale.capacityUsed === null ? "—" : `${(sale.capacityUsed * 100).toFixed(1)} % of ${users(sale.maxCapacity)}`;
  const last = ticks[ticks.length - 1];
  view.f.lastTick.value.textContent = last ? `${users(last.admitted)} admitted of ${number(last.batch)}, ${ago(serverNow - last.at)}` : "no tick yet";
  view.f.evicted.value.textContent = users(ticks.reduce((sum, t) => sum + t.evicted, 0));
  view.pause.textContent = sale.state === "paused" ? "Resume" : "Pause";
  view.pause.className = sale.state === "paused" ? "" : "danger";
  view.queueSwitch.textContent = sale.queue === "off" ? "Switch the queue on for this sale" : "Switch the queue off for this sale";
  const parts = [];
  if (sale.opensAt) parts.push(`Opens ${when(sale.opensAt)}.`);
  if (sale.drawCommitment) parts.push(`Draw commitment (SHA-256 of the seed): ${sale.drawCommitment}.`);
  if (sale.drawSeed) parts.push(`Seed, revealed at the draw (${when(sale.drawnAt)}, ${number(sale.drawEntrants)} entrants): ${sale.drawSeed}.`);
  else if (sale.drawCommitment) parts.push("The seed is revealed at the opening.");
  view.draw.textContent = parts.join(" ");
  view.draw.hidden = parts.length === 0;
  // Keep the budget fields in step with the sale unless the operator is editing them.
  const [batch, tick, capacity] = view.inputs.map(({ input }) => input);
  if (![batch, tick, capacity].includes(document.activeElement)) {
    batch.value = sale.batchSize;
    tick.value = sale.tickMs;
    capacity.value = sale.maxCapacity;
  }
  drawCharts(entry);
}

// A time chart of the last ten minutes on a canvas sized to its box.
function plot(canvas, ticks, series, label) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 300;
  const height = canvas.clientHeight || 160;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, width, height);
  const left = 44;
  const bottom = height - 18;
  const top = 8;
  const right = width - 8;
  // The last ten minutes at most, and at least one: a young sale fills the width.
  const span = Math.min(HISTORY_MS, Math.max(60000, ticks.length ? serverNow - ticks[0].at : 0));
  const from = serverNow - span;
  const x = (at) => left + ((at - from) / span) * (right - left);
  let highest = 1;
  for (const s of series) for (const t of ticks) highest = Math.max(highest, s.value(t));
  // A round top (1, 2 or 5 times a power of ten) whose half is a readable number too.
  const power = 10 ** Math.floor(Math.log10(highest));
  const max = [1, 2, 2.5, 5, 10].map((m) => m * power).find((m) => m >= highest) || highest;
  const y = (v) => bottom - (v / max) * (bottom - top);
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = "#57606a";
  g.strokeStyle = "#d0d7de";
  g.lineWidth = 1;
  for (const v of [0, max / 2, max]) {
    g.beginPath();
    g.moveTo(left, y(v));
    g.lineTo(right, y(v));
    g.stroke();
    g.fillText(Number(v).toLocaleString("en-US", { maximumFractionDigits: 1 }), 2, y(v) + 4);
  }
  g.fillText(`−${duration(span / 1000)}`, left, height - 4);
  g.fillText("now", right - 22, height - 4);
  const barWidth = Math.max(1, ((right - left) / span) * (ticks.length > 1 ? (ticks[ticks.length - 1].at - ticks[0].at) / (ticks.length - 1) : 1000) * 0.6);
  for (const s of series) {
    g.strokeStyle = s.color;
    g.fillStyle = s.color;
    if (s.kind === "bars") {
      for (const t of ticks) {
        const v = s.value(t);
        if (v > 0) g.fillRect(x(t.at) + s.offset * barWidth, y(v), barWidth, bottom - y(v));
      }
    } else {
      g.lineWidth = s.kind === "step" ? 1.5 : 2;
      g.beginPath();
      ticks.forEach((t, i) => {
        if (i === 0) g.moveTo(x(t.at), y(s.value(t)));
        else {
          if (s.kind === "step") g.lineTo(x(t.at), y(s.value(ticks[i - 1])));
          g.lineTo(x(t.at), y(s.value(t)));
        }
      });
      g.stroke();
    }
  }
  canvas.setAttribute("aria-label", label);
}

function drawCharts({ view, ticks, sale }) {
  const last = ticks[ticks.length - 1];
  plot(view.waitingChart.canvas, ticks,
    [{ kind: "line", color: COLORS.waiting, value: (t) => t.waiting }],
    `Users waiting over the last ${duration(Math.min(HISTORY_MS, ticks.length ? serverNow - ticks[0].at : 0) / 1000)}: ${users(sale.waitingCount)} now.`);
  plot(view.tickChart.canvas, ticks, [
    { kind: "bars", color: COLORS.admitted, offset: -0.5, value: (t) => t.admitted },
    { kind: "bars", color: COLORS.evicted, offset: 0.5, value: (t) => t.evicted },
    { kind: "step", color: COLORS.budget, value: (t) => t.batch },
  ], last
    ? `Admissions per tick: ${users(last.admitted)} at the last tick against a budget of ${users(last.batch)}; ${users(last.evicted)} evicted.`
    : "Admissions per tick: no tick yet.");
}

function renderReplicas(replicas, now) {
  const body = document.querySelector("#replicas tbody");
  body.replaceChildren();
  if (replicas.length === 0) {
    body.append(el("tr", {}, el("td", { colspan: "5", text: "No replica has registered." })));
    return;
  }
  for (const r of replicas) {
    const status = el("span", { class: `badge ${r.status}`, text: r.status });
    const share = r.slice ? `${((r.slice.split(":")[1] - r.slice.split(":")[0]) / 10000).toFixed(1)} %` : "—";
    body.append(el("tr", {},
      el("td", { "data-label": "Replica", text: r.name ? `${r.name} (${r.instance})` : r.instance }),
      el("td", { "data-label": "Status" }, status),
      el("td", { "data-label": "Last registration", text: ago(now - r.lastSeen) }),
      el("td", { "data-label": "Slice", text: share }),
      el("td", { "data-label": "Heartbeat credit", text: r.creditMs ? duration(r.creditMs / 1000) : "none" })));
  }
}

function renderFlag(flag) {
  const text = document.getElementById("flag-text");
  const rollout = document.getElementById("rollout");
  if (!flag.known) {
    text.textContent = "Not read from the store yet: every user queues until it is.";
    return;
  }
  const overrides = Object.entries(flag.targets).map(([t, on]) => `${t} ${on ? "on" : "off"}`);
  text.textContent = `The queue is ${flag.enabled ? "on" : "off"} for all sales, for ${flag.rolloutPercent} % of users`
    + (overrides.length ? `; per sale: ${overrides.join(", ")}.` : ".");
  if (document.activeElement !== rollout) rollout.value = flag.rolloutPercent;
}

function render(state) {
  serverNow = state.now;
  const names = state.replicas.filter((r) => r.status !== "silent").length;
  const storeText = state.storeError
    ? `Store: ${state.store}, not answering (${state.storeError}); sales and replicas are shown again once it answers`
    : `Store: ${state.store}`;
  document.getElementById("summary").textContent =
    `${storeText}${state.degraded ? ` · this replica is degraded (failing ${state.failOpenMode})` : ""} · ${names} live ${names === 1 ? "replica" : "replicas"} · updated ${new Date(state.now).toLocaleTimeString()}`;
  renderFlag(state.flag);
  renderReplicas(state.replicas, state.now);
  document.getElementById("sales-count").textContent = state.salesCount > state.sales.length
    ? `Showing the first ${state.sales.length} of ${number(state.salesCount)} sales and queues.`
    : `${number(state.salesCount)} ${state.salesCount === 1 ? "sale" : "sales"}.`;
  const seen = new Set();
  const list = document.getElementById("sales");
  for (const sale of state.sales) {
    seen.add(sale.key);
    let entry = sales.get(sale.key);
    if (!entry) {
      entry = { view: saleView(sale), ticks: [], sale };
      sales.set(sale.key, entry);
      list.append(entry.view.card);
    }
    entry.sale = sale;
    for (const t of sale.ticks) {
      if (!entry.ticks.length || t.at > entry.ticks[entry.ticks.length - 1].at) entry.ticks.push(t);
      lastTickAt = Math.max(lastTickAt, t.at);
    }
    entry.ticks = entry.ticks.filter((t) => t.at >= state.now - HISTORY_MS);
    updateSale(entry);
  }
  for (const [key, entry] of sales) {
    if (!seen.has(key) && !state.storeError) {
      entry.view.card.remove();
      sales.delete(key);
    }
  }
}

// One reading per tick of the fastest sale shown (between a quarter and two seconds).
function interval() {
  let tick = 1000;
  for (const { sale } of sales.values()) tick = Math.min(tick, sale.tickMs);
  return Math.min(2000, Math.max(250, tick));
}

async function poll() {
  clearTimeout(pollTimer);
  try {
    const response = await fetch(`/console/state?since=${lastTickAt}`, { cache: "no-store" });
    if (!response.ok) throw new Error(`status ${response.status}`);
    render(await response.json());
  } catch (e) {
    document.getElementById("summary").textContent = `The gateway could not be read (${e.message}); trying again.`;
  }
  pollTimer = setTimeout(poll, interval());
}

function localMs(input) {
  return input.value ? new Date(input.value).getTime() : undefined;
}

function setUp() {
  document.getElementById("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = document.getElementById("token");
    token = input.value || null;
    input.value = "";
    document.getElementById("token-state").textContent = token
      ? "Token set: kept in this page only, gone when it closes."
      : "No token: the page can watch, not change.";
  });
  document.getElementById("queue-on").addEventListener("click", () => {
    write("PUT", "/flag", { enabled: true }, "The queue is on for all sales.");
  });
  document.getElementById("queue-off").addEventListener("click", async () => {
    if (await confirmFirst("Switch the queue off for all sales? Every user then reaches the backend without waiting, at any rate.")) {
      write("PUT", "/flag", { enabled: false }, "The queue is off for all sales.");
    }
  });
  document.getElementById("rollout-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = Number(document.getElementById("rollout").value);
    write("PUT", "/flag", { rolloutPercent: value }, `Rollout set to ${value} %.`);
  });
  document.getElementById("create-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = (id) => document.getElementById(id);
    const body = {
      batchSize: Number(value("c-batch").value),
      tickMs: Number(value("c-tick").value),
      maxCapacity: Number(value("c-capacity").value),
      heartbeatTimeoutS: Number(value("c-heartbeat").value),
    };
    const opensAt = localMs(value("c-opens"));
    const prequeueOpensAt = localMs(value("c-prequeue"));
    if (opensAt !== undefined) body.opensAt = opensAt;
    if (prequeueOpensAt !== undefined) body.prequeueOpensAt = prequeueOpensAt;
    const type = value("c-type").value;
    const id = value("c-id").value;
    write("PUT", `/sales/${type}/${id}`, body, `Sale ${type} ${id} saved.`);
  });
  window.addEventListener("resize", () => sales.forEach((entry) => drawCharts(entry)));
  poll();
}

document.addEventListener("DOMContentLoaded", setUp);
