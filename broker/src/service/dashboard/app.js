// Meridian's operator dashboard: reads the broker's HTTP API with the session cookie a sign-in sets, and
// redraws every few seconds. No framework, no build step: this file is served as it is.
"use strict";

const REFRESH_MS = 5000;
const SPEND_EVERY = 6; // the spend chart is redrawn every sixth refresh
const SVG_NS = "http://www.w3.org/2000/svg";
const MAP_W = 960;
const MAP_H = 400; // latitudes 90 N to 60 S; Antarctica is left out

const state = {
  session: null,
  sites: [],
  jobs: [],
  world: null,
  colourBy: "utilization",
  archived: false,
  filters: { tenant: "", phase: "", site: "", text: "" },
  ticks: 0,
  timer: null,
};

class SignInNeeded extends Error {}

// ---------------------------------------------------------------- helpers

/** Makes an element (SVG ones in the SVG namespace); text children are text nodes, never markup. */
function el(tag, attrs, ...children) {
  const svg = ["svg", "g", "path", "circle", "text", "title", "line", "polyline"].includes(tag);
  const e = svg ? document.createElementNS(SVG_NS, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function replace(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
}

async function api(path, options) {
  const r = await fetch(path, { credentials: "same-origin", ...(options || {}) });
  let body = null;
  try {
    body = await r.json();
  } catch (_) {
    body = null;
  }
  if (r.status === 401) throw new SignInNeeded((body && body.error && body.error.message) || "sign in");
  if (!r.ok || !body || body.ok === undefined) {
    throw new Error((body && body.error && body.error.message) || `HTTP ${r.status}`);
  }
  return body.ok;
}

const usd = (micro) => (micro / 1e6).toFixed(micro < 1e7 ? 4 : 2);
const kwh = (wh) => (wh / 1000).toFixed(3);
const kg = (g) => (g / 1000).toFixed(3);
const ago = (ms) => `${Math.max(0, Math.round((Date.now() - ms) / 1000))} s ago`;
const project = ([lon, lat]) => [((lon + 180) / 360) * MAP_W, ((90 - lat) / 180) * 480];

function devices(site) {
  let count = 0;
  let free = 0;
  for (const p of site.pools) {
    count += p.count;
    free += p.free_milli / 1000;
  }
  return { count, used: Math.max(0, count - free) };
}

function siteColour(site) {
  if (state.colourBy === "carbon") {
    const x = Math.min(site.carbon_g_per_kwh / 600, 1);
    return `hsl(${Math.round(120 * (1 - x))}, 60%, 42%)`;
  }
  const d = devices(site);
  const u = d.count ? d.used / d.count : 0;
  return `hsl(${Math.round(120 * (1 - u))}, 70%, 45%)`;
}

// ---------------------------------------------------------------- sign-in

async function signIn(token) {
  const r = await fetch("/v1/session", {
    method: "POST",
    credentials: "same-origin",
    headers: { Authorization: `Bearer ${token}` },
  });
  if (!r.ok) {
    let msg = `HTTP ${r.status}`;
    try {
      msg = (await r.json()).error.message;
    } catch (_) {
      /* keep the status */
    }
    throw new Error(msg);
  }
}

function showSignIn(message) {
  clearInterval(state.timer);
  document.getElementById("sign-out").hidden = true;
  replace(document.getElementById("who"));
  const input = el("input", { type: "password", id: "token", placeholder: "API token", size: 48, autocomplete: "off" });
  const form = el(
    "form",
    {
      class: "sign-in",
      onsubmit: async (ev) => {
        ev.preventDefault();
        try {
          await signIn(input.value.trim());
          start();
        } catch (e) {
          replace(note, e.message);
        }
      },
    },
    el("label", { for: "token" }, "Token"),
    input,
    el("button", { type: "submit" }, "Sign in"),
  );
  const note = el("p", { class: "error" }, message || "");
  replace(
    document.getElementById("main"),
    el("section", { class: "wide", id: "sign-in" }, el("h2", {}, "Sign in"), form, note,
      el("p", { class: "muted" }, "An API token (meridian token create); `meridian up` prints an address that signs in at once.")),
  );
}

// ---------------------------------------------------------------- data

async function load() {
  const scope = state.archived ? "all" : "live";
  const [sites, page] = await Promise.all([api("/v1/sites"), api(`/v1/jobs?scope=${scope}&limit=500`)]);
  state.sites = sites;
  state.jobs = page.jobs;
  replace(document.getElementById("updated"), `updated ${new Date().toLocaleTimeString()}`);
}

async function loadWorld() {
  if (state.world) return state.world;
  const r = await fetch("/dashboard/countries-110m.json");
  const topo = await r.json();
  state.world = topojson.feature(topo, topo.objects.countries).features.filter((f) => f.id !== "010");
  return state.world;
}

// ---------------------------------------------------------------- overview

function overviewSkeleton() {
  const colour = el(
    "select",
    { id: "colour-by", onchange: (e) => { state.colourBy = e.target.value; drawSites(); } },
    el("option", { value: "utilization" }, "utilization"),
    el("option", { value: "carbon" }, "grid carbon"),
  );
  colour.value = state.colourBy;
  const f = state.filters;
  const filter = (key) => (e) => { f[key] = e.target.value; drawJobs(); };
  const archived = el("input", {
    type: "checkbox",
    id: "archived",
    checked: state.archived,
    onchange: (e) => { state.archived = e.target.checked; refresh(); },
  });
  replace(
    document.getElementById("main"),
    el("section", { class: "wide", id: "map-card" },
      el("h2", {}, "Federation ", el("label", { class: "muted" }, " colour by ", colour)),
      el("svg", { id: "map", viewBox: `0 0 ${MAP_W} ${MAP_H}`, role: "img", "aria-label": "map of sites" },
        el("g", { id: "countries" }), el("g", { id: "flows" }), el("g", { id: "sites" })),
      el("div", { class: "legend", id: "legend" })),
    el("section", { id: "queues-card" }, el("h2", {}, "Queues"), el("table", { id: "queues" })),
    el("section", { id: "spend-card" }, el("h2", {}, "Spend and carbon per tenant"), el("div", { id: "spend" }, el("p", { class: "muted" }, "…"))),
    el("section", { class: "wide", id: "sites-card" }, el("h2", {}, "Sites"), el("table", { id: "sites-table" })),
    el("section", { class: "wide", id: "jobs-card" },
      el("h2", {}, "Jobs"),
      el("div", { class: "filters" },
        el("select", { id: "filter-tenant", onchange: filter("tenant") }),
        el("select", { id: "filter-phase", onchange: filter("phase") }),
        el("select", { id: "filter-site", onchange: filter("site") }),
        el("input", { id: "filter-text", placeholder: "search id, name, why", value: f.text, oninput: filter("text") }),
        el("label", { class: "muted" }, archived, " include archived")),
      el("table", { id: "jobs" })),
  );
  loadWorld().then(drawCountries).catch((e) => replace(document.getElementById("legend"), `map: ${e.message}`));
}

function ringsPath(rings) {
  let d = "";
  for (const ring of rings) {
    // A ring that crosses the antimeridian is unwrapped (its far side continues past the map's edge, where the
    // view clips it) rather than drawn back across the map.
    let shift = 0;
    let prev = null;
    ring.forEach((p, i) => {
      if (prev !== null && p[0] - prev[0] > 180) shift -= 360;
      if (prev !== null && p[0] - prev[0] < -180) shift += 360;
      prev = p;
      const [x, y] = project([p[0] + shift, p[1]]);
      d += `${i ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`;
    });
    d += "Z";
  }
  return d;
}

function drawCountries(features) {
  const g = document.getElementById("countries");
  if (!g) return;
  replace(g, features.map((f) => {
    const polys = f.geometry.type === "Polygon" ? [f.geometry.coordinates] : f.geometry.coordinates;
    return el("path", { class: "country", d: polys.map(ringsPath).join("") }, el("title", {}, f.properties.name));
  }));
}

function drawSites() {
  const g = document.getElementById("sites");
  if (!g) return;
  const byId = new Map(state.sites.map((s) => [s.site, s]));
  replace(g, state.sites.map((s) => {
    const [x, y] = project([s.location.lon, s.location.lat]);
    const d = devices(s);
    const r = 4 + 2.2 * Math.sqrt(d.count);
    const title = `${s.site} (${s.tier}${s.up ? "" : ", down"}${s.draining ? ", draining" : ""}): ${d.used.toFixed(1)} of ${d.count} devices in use, ${s.carbon_g_per_kwh} gCO2e/kWh, PUE ${s.pue}`;
    return el("g", {},
      el("circle", { class: `site${s.up ? "" : " down"}`, "data-site": s.site, cx: x.toFixed(1), cy: y.toFixed(1), r: r.toFixed(1), fill: siteColour(s) },
        el("title", {}, title)),
      el("text", { class: "site-label", x: (x + r + 2).toFixed(1), y: (y + 3).toFixed(1) }, s.site));
  }));
  // Running jobs as flows from their users to their site.
  const flows = [];
  for (const j of state.jobs) {
    if (!["running", "offered"].includes(j.phase) || !j.site || !j.users) continue;
    const s = byId.get(j.site);
    if (!s) continue;
    const [x2, y2] = project([s.location.lon, s.location.lat]);
    for (const u of j.users) {
      const [x1, y1] = project([u.lon, u.lat]);
      const mx = (x1 + x2) / 2;
      const my = (y1 + y2) / 2 - Math.min(60, Math.hypot(x2 - x1, y2 - y1) / 4);
      flows.push(el("path", { class: "flow", "data-job": j.job, d: `M${x1.toFixed(1)},${y1.toFixed(1)} Q${mx.toFixed(1)},${my.toFixed(1)} ${x2.toFixed(1)},${y2.toFixed(1)}` }));
      flows.push(el("circle", { class: "user", cx: x1.toFixed(1), cy: y1.toFixed(1), r: 1.8 }));
    }
  }
  replace(document.getElementById("flows"), flows);
  replace(document.getElementById("legend"),
    state.colourBy === "carbon"
      ? "circle size: devices; colour: grid carbon, green 0 to brown 600+ gCO2e/kWh; lines: running jobs from their users"
      : "circle size: devices; colour: share in use, green idle to red full; grey dashed: down; lines: running jobs from their users");
}

function drawQueues() {
  const groups = new Map();
  for (const j of state.jobs) {
    const q = j.queue || j.tenant;
    if (!groups.has(q)) groups.set(q, { pending: 0, running: 0, reasons: new Map() });
    const g = groups.get(q);
    if (j.phase === "pending") {
      g.pending += 1;
      const r = j.wait_reason || "waiting";
      g.reasons.set(r, (g.reasons.get(r) || 0) + 1);
    } else if (j.phase === "running" || j.phase === "offered") {
      g.running += 1;
    }
  }
  const rows = [...groups.entries()].sort().map(([q, g]) =>
    el("tr", { "data-queue": q },
      el("td", {}, q),
      el("td", { class: "num" }, g.running),
      el("td", { class: "num" }, g.pending),
      el("td", {}, [...g.reasons.entries()].map(([r, n]) => `${r} ${n}`).join(", ") || "—")));
  replace(document.getElementById("queues"),
    el("thead", {}, el("tr", {}, el("th", {}, "queue"), el("th", { class: "num" }, "running"), el("th", { class: "num" }, "pending"), el("th", {}, "why they wait"))),
    el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 4, class: "muted" }, "no live jobs"))));
}

function drawSitesTable() {
  const rows = state.sites.map((s) => {
    const d = devices(s);
    return el("tr", { "data-site-row": s.site },
      el("td", {}, s.site), el("td", {}, s.tier), el("td", {}, s.up ? (s.draining ? "draining" : "up") : "down"),
      el("td", {}, s.pools.map((p) => `${p.count} × ${p.model}`).join(", ")),
      el("td", { class: "num" }, `${d.count ? Math.round((100 * d.used) / d.count) : 0}%`),
      el("td", { class: "num" }, s.carbon_g_per_kwh), el("td", { class: "num" }, s.pue),
      el("td", { class: "muted" }, ago(s.last_seen_ms)));
  });
  replace(document.getElementById("sites-table"),
    el("thead", {}, el("tr", {}, ["site", "tier", "state", "devices", "in use", "gCO2e/kWh", "PUE", "last heard"].map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

function options(select, label, values, current) {
  replace(select, el("option", { value: "" }, `any ${label}`), [...values].sort().map((v) => el("option", { value: v }, v)));
  select.value = current;
}

function drawJobs() {
  const f = state.filters;
  options(document.getElementById("filter-tenant"), "tenant", new Set(state.jobs.map((j) => j.tenant)), f.tenant);
  options(document.getElementById("filter-phase"), "state", new Set(state.jobs.map((j) => j.phase)), f.phase);
  options(document.getElementById("filter-site"), "site", new Set(state.sites.map((s) => s.site)), f.site);
  const text = f.text.toLowerCase();
  const shown = state.jobs.filter((j) =>
    (!f.tenant || j.tenant === f.tenant) && (!f.phase || j.phase === f.phase) && (!f.site || j.site === f.site) &&
    (!text || [j.job, j.name || "", j.why].some((s) => s.toLowerCase().includes(text))));
  const rows = shown.map((j) => {
    const spent = j.metered.cost_micro_usd || (j.estimate ? j.estimate.cost_micro_usd : 0);
    return el("tr", { "data-job": j.job },
      el("td", {}, el("a", { href: `#/job/${encodeURIComponent(j.job)}`, class: "job-link" }, j.job)),
      el("td", {}, j.name || ""), el("td", {}, j.tenant), el("td", {}, j.queue || ""),
      el("td", {}, el("span", { class: `pill ${j.phase}` }, j.phase)),
      el("td", {}, j.site || "—"), el("td", { class: "num" }, j.attempt),
      el("td", {}, j.wait_reason || ""), el("td", { class: "num" }, usd(spent)),
      el("td", { class: "why" }, j.why));
  });
  replace(document.getElementById("jobs"),
    el("thead", {}, el("tr", {}, ["job", "name", "tenant", "queue", "state", "site", "att", "waits on", "USD", "why"].map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 10, class: "muted" }, "no job matches"))));
}

/** Cumulative spend and carbon per tenant at eight moments from the first submission to now. */
async function drawSpend() {
  const box = document.getElementById("spend");
  if (!box) return;
  const first = Math.min(...state.jobs.map((j) => j.submitted_at_ms), Date.now() - 3600e3);
  const now = Date.now() + 1000;
  const points = [...Array(8).keys()].map((i) => Math.round(first + ((now - first) * (i + 1)) / 8));
  const reports = await Promise.all(points.map((t) => api(`/v1/report?to_ms=${t}`)));
  const last = reports[reports.length - 1];
  const series = (tenant, key) => reports.map((r) => (r.by_tenant.find((row) => row.key === tenant) || {})[key] || 0);
  const spark = (values, cls) => {
    const max = Math.max(...values, 1);
    const pts = values.map((v, i) => `${(i * 80) / (values.length - 1)},${(18 - (16 * v) / max).toFixed(1)}`).join(" ");
    return el("svg", { width: 84, height: 20, viewBox: "0 0 84 20" }, el("polyline", { class: `spark ${cls}`, points: pts }));
  };
  const rows = last.by_tenant.map((row) =>
    el("tr", { "data-tenant": row.key },
      el("td", {}, row.key), el("td", { class: "num" }, usd(row.cost_micro_usd)), el("td", {}, spark(series(row.key, "cost_micro_usd"), "usd")),
      el("td", { class: "num" }, kwh(row.energy_wh)),
      el("td", { class: "num" }, kg(row.co2_g)), el("td", {}, spark(series(row.key, "co2_g"), "co2"))));
  replace(box,
    el("table", {},
      el("thead", {}, el("tr", {}, ["tenant", "USD", "over time", "kWh", "kgCO2e", "over time"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 6, class: "muted" }, "nothing metered yet")))),
    el("p", { class: "muted" }, `metered attempts, cumulative since ${new Date(first).toLocaleString()}`));
}

// ---------------------------------------------------------------- job page

async function jobPage(id) {
  const main = document.getElementById("main");
  const [t, x] = await Promise.all([
    api(`/v1/jobs/${encodeURIComponent(id)}/timeline`),
    api(`/v1/jobs/${encodeURIComponent(id)}/explain`),
  ]);
  const t0 = t.events.length ? t.events[0].at_ms : 0;
  const events = t.events.map((e) =>
    el("tr", { class: "timeline-row" },
      el("td", { class: "num" }, ((e.at_ms - t0) / 1000).toFixed(1)), el("td", {}, e.event),
      el("td", { class: "num" }, e.attempt ?? "—"), el("td", {}, e.site || "—"), el("td", { class: "why" }, e.detail)));
  const attempts = t.attempts.map((a) =>
    el("tr", {},
      el("td", { class: "num" }, a.attempt), el("td", {}, a.site), el("td", {}, `${a.pool} (${a.model})`),
      el("td", { class: "num" }, (a.milli / 1000).toFixed(3)), el("td", { class: "num" }, (a.runtime_ms / 1000).toFixed(1)),
      el("td", { class: "num" }, usd(a.amounts.cost_micro_usd)), el("td", { class: "num" }, kwh(a.amounts.energy_wh)),
      el("td", { class: "num" }, kg(a.amounts.co2_g))));
  const candidates = x.candidates.map((c) =>
    el("tr", { class: c.chosen ? "chosen" : "" },
      el("td", {}, c.site), el("td", {}, c.tier), el("td", {}, c.pool || "—"),
      c.terms
        ? [el("td", { class: "num" }, c.terms.score.toFixed(4)), el("td", { class: "num" }, usd(c.terms.cost_micro_usd)),
          el("td", { class: "num" }, kg(c.terms.co2_g)), el("td", { class: "num" }, c.terms.latency_ms.toFixed(1))]
        : el("td", { colspan: 4, class: "why" }, c.rejected || ""),
      el("td", {}, c.chosen ? "CHOSEN" : "")));
  const table = (heads, rows, empty) =>
    el("table", {}, el("thead", {}, el("tr", {}, heads.map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: heads.length, class: "muted" }, empty))));
  replace(main,
    el("section", { class: "wide", id: "job-page", "data-job": t.job },
      el("p", {}, el("a", { href: "#/" }, "← federation")),
      el("h2", {}, `${t.job} (${t.tenant}) `, el("span", { class: `pill ${t.phase}` }, t.phase)),
      el("p", { class: "why" }, t.why)),
    el("section", { class: "wide" }, el("h2", {}, "Timeline"),
      table(["T+ s", "event", "att", "site", "detail"], events, "nothing yet")),
    el("section", {}, el("h2", {}, "Attempts"),
      table(["att", "site", "pool", "devices", "ran s", "USD", "kWh", "kgCO2e"], attempts, "not offered yet")),
    el("section", {}, el("h2", {}, `Placement (policy ${x.policy || "—"})`),
      table(["site", "tier", "pool", "score", "USD", "kgCO2e", "RTT ms", ""], candidates, "no decision yet")),
    el("section", { class: "wide" }, el("h2", {}, "Log (last lines)"),
      el("pre", { id: "log" }, t.log_tail ?? `(${t.log_error || "no log"})`)));
}

// ---------------------------------------------------------------- routing and refresh

function route() {
  const m = location.hash.match(/^#\/job\/(.+)$/);
  if (m) {
    return jobPage(decodeURIComponent(m[1])).catch(failed);
  }
  overviewSkeleton();
  return refresh();
}

async function refresh() {
  if (location.hash.startsWith("#/job/")) return;
  try {
    await load();
    drawSites();
    drawQueues();
    drawSitesTable();
    drawJobs();
    if (state.ticks++ % SPEND_EVERY === 0) await drawSpend();
  } catch (e) {
    failed(e);
  }
}

function failed(e) {
  if (e instanceof SignInNeeded) return showSignIn(e.message);
  const main = document.getElementById("main");
  const note = document.getElementById("failure") || main.appendChild(el("p", { id: "failure", class: "error" }));
  replace(note, e.message);
}

async function start() {
  const m = location.hash.match(/^#token=(.+)$/);
  if (m) {
    // The sign-in address `meridian up` prints: the token leaves the address bar at once.
    history.replaceState(null, "", "/#/");
    try {
      await signIn(decodeURIComponent(m[1]));
    } catch (e) {
      return showSignIn(e.message);
    }
  }
  try {
    state.session = await api("/v1/session");
  } catch (e) {
    return e instanceof SignInNeeded ? showSignIn("") : failed(e);
  }
  const s = state.session;
  replace(document.getElementById("who"), `signed in as ${s.who}${s.admin ? " (administrator)" : s.tenant ? ` (tenant ${s.tenant})` : " (federation-wide viewer)"}`);
  const out = document.getElementById("sign-out");
  out.hidden = false;
  out.onclick = async () => {
    await fetch("/v1/session", { method: "DELETE", credentials: "same-origin" });
    showSignIn("signed out");
  };
  state.ticks = 0;
  await route();
  clearInterval(state.timer);
  state.timer = setInterval(refresh, REFRESH_MS);
}

window.addEventListener("hashchange", () => {
  if (state.session) route();
});
start();
