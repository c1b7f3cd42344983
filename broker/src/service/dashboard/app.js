// Meridian's operator dashboard: reads the broker's HTTP API with the session cookie a sign-in sets, and
// redraws every few seconds. No framework, no build step: this file is served as it is.
"use strict";

const REFRESH_MS = 5000;
const SPEND_EVERY = 6; // the spend chart is redrawn every sixth refresh
const SVG_NS = "http://www.w3.org/2000/svg";
const MAP_W = 960;
const MAP_H = 400; // latitudes 90 N to 60 S; Antarctica is left out

const PAGE = 50; // jobs per page of the table
const PHASES = ["pending", "offered", "running", "cancelling", "succeeded", "failed", "cancelled"];

const state = {
  session: null,
  sites: [],
  summary: { queues: [], sites: [], flows: [] }, // GET /v1/queues: counts over every live job
  services: [],
  jobs: [],
  next: null, // the cursor of the page after this one
  cursors: [null], // the cursors of the pages up to this one (null: the first)
  world: null,
  colourBy: "utilization",
  archived: false,
  filters: { tenant: "", phase: "", site: "", text: "" },
  ticks: 0,
  timer: null,
  typing: null,
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

/** The address of the jobs page shown: newest first, filtered by the broker, from the page's cursor. */
function jobsUrl() {
  const f = state.filters;
  const q = new URLSearchParams({ scope: state.archived ? "all" : "live", limit: String(PAGE), newest_first: "true" });
  if (f.tenant) q.set("tenant", f.tenant);
  if (f.phase) q.set("state", f.phase);
  if (f.site) q.set("site", f.site);
  if (f.text) q.set("text", f.text);
  const cursor = state.cursors[state.cursors.length - 1];
  if (cursor) q.set("cursor", cursor);
  return `/v1/jobs?${q}`;
}

async function load() {
  const [sites, summary, page, services] = await Promise.all([
    api("/v1/sites"),
    api("/v1/queues?head=0"),
    api(jobsUrl()),
    api("/v1/services").catch(() => []),
  ]);
  state.sites = sites;
  state.summary = summary;
  state.jobs = page.jobs;
  state.next = page.next || null;
  state.services = services;
  replace(document.getElementById("updated"), `updated ${new Date().toLocaleTimeString()}`);
}

/** The table shows its first page again (after a filter changed). */
function firstPage() {
  state.cursors = [null];
  refresh();
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
  const filter = (key) => (e) => { f[key] = e.target.value; firstPage(); };
  // Typing waits for a pause before it asks the broker.
  const typed = (key) => (e) => {
    f[key] = e.target.value.trim();
    clearTimeout(state.typing);
    state.typing = setTimeout(firstPage, 400);
  };
  const archived = el("input", {
    type: "checkbox",
    id: "archived",
    checked: state.archived,
    onchange: (e) => { state.archived = e.target.checked; firstPage(); },
  });
  const phase = el("select", { id: "filter-phase", onchange: filter("phase") },
    el("option", { value: "" }, "any state"), PHASES.map((p) => el("option", { value: p }, p)));
  phase.value = f.phase;
  const pager = el("div", { class: "pager" },
    el("button", { type: "button", id: "newer", onclick: () => { if (state.cursors.length > 1) { state.cursors.pop(); refresh(); } } }, "← newer"),
    el("span", { id: "page-no", class: "muted" }),
    el("button", { type: "button", id: "older", onclick: () => { if (state.next) { state.cursors.push(state.next); refresh(); } } }, "older →"));
  replace(
    document.getElementById("main"),
    el("section", { class: "wide", id: "map-card" },
      el("h2", {}, "Federation ", el("label", { class: "muted" }, " colour by ", colour)),
      el("svg", { id: "map", viewBox: `0 0 ${MAP_W} ${MAP_H}`, role: "img", "aria-label": "map of sites" },
        el("g", { id: "countries" }), el("g", { id: "flows" }), el("g", { id: "sites" })),
      el("div", { class: "legend", id: "legend" })),
    el("section", { id: "queues-card" }, el("h2", {}, "Queues ", el("span", { class: "muted", id: "live-count" })), el("table", { id: "queues" })),
    el("section", { id: "spend-card" }, el("h2", {}, "Spend and carbon per tenant, last 24 h"), el("div", { id: "spend" }, el("p", { class: "muted" }, "…"))),
    el("section", { class: "wide", id: "services-card" }, el("h2", {}, "Services"), el("table", { id: "services" })),
    el("section", { class: "wide", id: "sites-card" }, el("h2", {}, "Sites"), el("table", { id: "sites-table" })),
    el("section", { class: "wide", id: "jobs-card" },
      el("h2", {}, "Jobs ", el("span", { class: "muted" }, "newest first")),
      el("div", { class: "filters" },
        el("input", { id: "filter-tenant", placeholder: "tenant", value: f.tenant, size: 12, oninput: typed("tenant") }),
        phase,
        el("select", { id: "filter-site", onchange: filter("site") }),
        el("input", { id: "filter-text", placeholder: "search id, name, why", value: f.text, oninput: typed("text") }),
        el("label", { class: "muted" }, archived, " include archived"),
        pager),
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

/** Site labels placed so that none overlaps another or a site's circle: each tries spots around its circle,
 * nearest first, then further out with a leader line. */
function placeLabels(marks) {
  const CH = 5.6; // width of a character at the labels' size, in map units (a little more than it takes)
  const H = 10;
  const boxes = marks.map((m) => ({ x: m.x - m.r, y: m.y - m.r, w: 2 * m.r, h: 2 * m.r }));
  const hit = (a) => boxes.some((b) => a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h);
  const placed = [];
  // Big sites first: they have the most to say.
  for (const m of [...marks].sort((a, b) => b.r - a.r)) {
    const w = m.label.length * CH;
    let best = null;
    for (const d of [0, 14, 28, 42, 56]) {
      const spots = [
        [m.x + m.r + 2 + d, m.y + 3], [m.x - m.r - 2 - w - d, m.y + 3],
        [m.x - w / 2, m.y - m.r - 3 - d], [m.x - w / 2, m.y + m.r + H + d],
        [m.x + m.r + d * 0.7, m.y - m.r - d * 0.7], [m.x + m.r + d * 0.7, m.y + m.r + H + d * 0.7],
        [m.x - m.r - w - d * 0.7, m.y - m.r - d * 0.7], [m.x - m.r - w - d * 0.7, m.y + m.r + H + d * 0.7],
      ];
      for (const [x, y] of spots) {
        const box = { x, y: y - H + 2, w, h: H };
        if (x < 0 || x + w > MAP_W || box.y < 0 || y > MAP_H) continue;
        if (!hit(box)) { best = { x, y, box, far: d > 0 }; break; }
      }
      if (best) break;
    }
    if (!best) {
      const x = Math.min(Math.max(m.x + m.r + 2, 0), MAP_W - w);
      best = { x, y: m.y + 3, box: { x, y: m.y - 7, w, h: H }, far: false };
    }
    boxes.push(best.box);
    placed.push({ site: m.site, x: best.x, y: best.y, w, leader: best.far ? [m.x, m.y] : null });
  }
  return placed;
}

function drawSites() {
  const g = document.getElementById("sites");
  if (!g) return;
  const byId = new Map(state.sites.map((s) => [s.site, s]));
  const load = new Map(state.summary.sites.map((l) => [l.site, l]));
  const marks = state.sites.map((s) => {
    const [x, y] = project([s.location.lon, s.location.lat]);
    const d = devices(s);
    return { site: s.site, label: s.site, x, y, r: 4 + 2.2 * Math.sqrt(d.count), s, d };
  });
  const labels = new Map(placeLabels(marks).map((l) => [l.site, l]));
  replace(g, marks.map(({ s, d, x, y, r }) => {
    const l = load.get(s.site) || { running: 0, offered: 0 };
    const title = `${s.site} (${s.tier}${s.up ? "" : ", down"}${s.draining ? ", draining" : ""}): ${d.used.toFixed(1)} of ${d.count} devices in use, ${l.running} jobs running, ${s.carbon_g_per_kwh} gCO2e/kWh, PUE ${s.pue}`;
    const label = labels.get(s.site);
    return el("g", {},
      label.leader ? el("line", { class: "leader", x1: x.toFixed(1), y1: y.toFixed(1), x2: (label.x + label.w / 2).toFixed(1), y2: (label.y - 3).toFixed(1) }) : null,
      el("circle", { class: `site${s.up ? "" : " down"}`, "data-site": s.site, cx: x.toFixed(1), cy: y.toFixed(1), r: r.toFixed(1), fill: siteColour(s),
        onclick: () => { location.hash = `#/site/${encodeURIComponent(s.site)}`; } },
        el("title", {}, title)),
      el("text", { class: "site-label", "data-label": s.site, x: label.x.toFixed(1), y: label.y.toFixed(1) }, s.site));
  }));
  // Running work as flows from its users' places to its sites, one line per place and site, as thick as the
  // number of jobs (counted by the broker over every live job).
  const flows = [];
  for (const f of state.summary.flows) {
    const s = byId.get(f.site);
    if (!s) continue;
    const [x2, y2] = project([s.location.lon, s.location.lat]);
    const [x1, y1] = project([f.from.lon, f.from.lat]);
    const mx = (x1 + x2) / 2;
    const my = (y1 + y2) / 2 - Math.min(60, Math.hypot(x2 - x1, y2 - y1) / 4);
    flows.push(el("path", { class: "flow", "data-site": f.site, "data-jobs": f.jobs, "stroke-width": (1 + Math.log2(f.jobs)).toFixed(2),
      d: `M${x1.toFixed(1)},${y1.toFixed(1)} Q${mx.toFixed(1)},${my.toFixed(1)} ${x2.toFixed(1)},${y2.toFixed(1)}` },
      el("title", {}, `${f.jobs} running job${f.jobs === 1 ? "" : "s"} at ${f.site} from users at ${f.from.lat}, ${f.from.lon}`)));
    flows.push(el("circle", { class: "user", cx: x1.toFixed(1), cy: y1.toFixed(1), r: 1.8 }));
  }
  replace(document.getElementById("flows"), flows);
  replace(document.getElementById("legend"),
    state.colourBy === "carbon"
      ? "circle size: devices; colour: grid carbon, green 0 to brown 600+ gCO2e/kWh; lines: running jobs from their users (thicker: more jobs); click a site for its page"
      : "circle size: devices; colour: share in use, green idle to red full; grey dashed: down; lines: running jobs from their users (thicker: more jobs); click a site for its page");
}

function drawQueues() {
  const qs = state.summary.queues;
  const live = qs.reduce((n, q) => n + q.running + q.offered + q.pending, 0);
  replace(document.getElementById("live-count"), `${live} live job${live === 1 ? "" : "s"}`);
  const rows = qs.map((q) =>
    el("tr", { "data-queue": q.queue },
      el("td", {}, q.queue),
      el("td", { class: "num" }, q.running + q.offered),
      el("td", { class: "num" }, q.pending),
      el("td", {}, Object.entries(q.reasons).map(([r, n]) => `${r} ${n}`).join(", ") || "—")));
  replace(document.getElementById("queues"),
    el("thead", {}, el("tr", {}, el("th", {}, "queue"), el("th", { class: "num" }, "running"), el("th", { class: "num" }, "pending"), el("th", {}, "why they wait"))),
    el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 4, class: "muted" }, "no live jobs"))));
}

function drawServices() {
  const box = document.getElementById("services");
  if (!box) return;
  const rows = state.services.map((v) => {
    const at = new Map();
    for (const r of v.replicas) {
      const k = `${r.site}/${r.pool || "?"}`;
      const c = at.get(k) || { running: 0, starting: 0 };
      c[r.state === "running" ? "running" : "starting"] += 1;
      at.set(k, c);
    }
    const where = [...at.entries()].sort().map(([k, c]) => `${k} ${c.running}${c.starting ? ` (+${c.starting} starting)` : ""}`).join(", ");
    const demand = v.demand.map((d) => `${d.name} ${d.per_s.toFixed(1)}/s`).join(", ");
    const backoff = (v.backoff || []).map((b) => `${b.site}/${b.pool}: exit code ${b.last_exit_code ?? "?"}, ${b.exits_in_a_row} in a row`).join("; ");
    return el("tr", { "data-service": v.spec.name },
      el("td", {}, v.spec.name), el("td", {}, v.spec.tenant),
      el("td", {}, el("span", { class: `pill ${v.health || "healthy"}` }, v.health || "healthy")),
      el("td", { class: "num" }, v.replicas.length),
      el("td", {}, where || "—"), el("td", {}, demand || "—"),
      el("td", { class: "why", "data-routes": v.spec.name }, "…"),
      el("td", { class: "why" }, backoff || ""));
  });
  replace(box,
    el("thead", {}, el("tr", {}, ["service", "tenant", "health", "replicas", "where (site/pool running)", "demand", "routes (location → site weight)", "backoff"].map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 8, class: "muted" }, "no services"))));
  for (const v of state.services) {
    api(`/v1/services/${encodeURIComponent(v.spec.name)}/routes?tenant=${encodeURIComponent(v.spec.tenant)}`)
      .then((r) => {
        const cell = box.querySelector(`td[data-routes="${CSS.escape(v.spec.name)}"]`);
        if (!cell) return;
        replace(cell, r.locations.map((l) => `${l.location} → ${l.routes.map((x) => `${x.site} ${(100 * x.weight).toFixed(0)}%`).join(" ") || "none"}`).join("; ") || "—");
      })
      .catch(() => {});
  }
}

function drawSitesTable() {
  const rows = state.sites.map((s) => {
    const d = devices(s);
    const l = state.summary.sites.find((x) => x.site === s.site) || { running: 0, offered: 0 };
    return el("tr", { "data-site-row": s.site },
      el("td", {}, el("a", { href: `#/site/${encodeURIComponent(s.site)}`, class: "site-link" }, s.site)), el("td", {}, s.tier), el("td", {}, s.up ? (s.draining ? "draining" : "up") : "down"),
      el("td", {}, s.pools.map((p) => `${p.count} × ${p.model}`).join(", ")),
      el("td", { class: "num" }, `${d.count ? Math.round((100 * d.used) / d.count) : 0}%`),
      el("td", { class: "num" }, l.running + l.offered),
      el("td", { class: "num" }, s.carbon_g_per_kwh), el("td", { class: "num" }, s.pue),
      el("td", { class: "muted" }, ago(s.last_seen_ms)));
  });
  replace(document.getElementById("sites-table"),
    el("thead", {}, el("tr", {}, ["site", "tier", "state", "devices", "in use", "jobs", "gCO2e/kWh", "PUE", "last heard"].map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

function options(select, label, values, current) {
  replace(select, el("option", { value: "" }, `any ${label}`), [...values].sort().map((v) => el("option", { value: v }, v)));
  select.value = current;
}

function drawJobs() {
  const f = state.filters;
  options(document.getElementById("filter-site"), "site", new Set(state.sites.map((s) => s.site)), f.site);
  const page = state.cursors.length;
  const first = (page - 1) * PAGE + 1;
  replace(document.getElementById("page-no"),
    state.jobs.length ? `${first}–${first + state.jobs.length - 1}${state.next ? "" : " (the last)"}` : "");
  document.getElementById("newer").disabled = page <= 1;
  document.getElementById("older").disabled = !state.next;
  const money = (a) => (a ? usd(a.cost_micro_usd) : "—");
  const rows = state.jobs.map((j) =>
    el("tr", { "data-job": j.job },
      el("td", {}, el("a", { href: `#/job/${encodeURIComponent(j.job)}`, class: "job-link" }, j.job)),
      el("td", {}, j.name || ""), el("td", {}, j.tenant), el("td", {}, j.queue || ""),
      el("td", {}, el("span", { class: `pill ${j.phase}` }, j.phase)),
      el("td", {}, j.site ? el("a", { href: `#/site/${encodeURIComponent(j.site)}` }, j.site) : "—"), el("td", { class: "num" }, j.attempt),
      el("td", {}, j.wait_reason || ""),
      el("td", { class: "num estimate" }, money(j.estimate)),
      el("td", { class: "num metered" }, j.metered.cost_micro_usd || j.finished_at_ms ? usd(j.metered.cost_micro_usd) : "—"),
      el("td", { class: "why" }, j.why)));
  replace(document.getElementById("jobs"),
    el("thead", {}, el("tr", {}, ["job", "name", "tenant", "queue", "state", "site", "att", "waits on"].map((h) => el("th", {}, h)),
      el("th", { class: "num", title: "what placement expected the whole run to cost at the chosen site" }, "est. USD"),
      el("th", { class: "num", title: "metered from the finished attempts' run time" }, "metered USD"),
      el("th", {}, "why"))),
    el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 11, class: "muted" }, "no job matches"))));
}

/** Cumulative spend and carbon per tenant at eight moments from the first submission to now. */
async function drawSpend() {
  const box = document.getElementById("spend");
  if (!box) return;
  // The last day (the jobs on the table are only a page of them, so they do not say when work began).
  const now = Date.now() + 1000;
  const first = now - 24 * 3600e3;
  const points = [...Array(8).keys()].map((i) => Math.round(first + ((now - first) * (i + 1)) / 8));
  const reports = await Promise.all(points.map((t) => api(`/v1/report?from_ms=${first}&to_ms=${t}`)));
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
    el("p", { class: "muted" }, `metered attempts of the last 24 h, cumulative, since ${new Date(first).toISOString().slice(0, 16).replace("T", " ")} UTC`));
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
      el("p", { class: "why" }, t.why),
      x.decided_by ? el("p", { id: "decided-by" }, `decided by ${x.decided_by}`) : null),
    el("section", { class: "wide" }, el("h2", {}, "Timeline"),
      table(["T+ s", "event", "att", "site", "detail"], events, "nothing yet")),
    el("section", {}, el("h2", {}, "Attempts"),
      table(["att", "site", "pool", "devices", "ran s", "USD", "kWh", "kgCO2e"], attempts, "not offered yet")),
    el("section", {}, el("h2", {}, `Placement (policy ${x.policy || "—"})`),
      table(["site", "tier", "pool", "score", "USD", "kgCO2e", "RTT ms", ""], candidates, "no decision yet")),
    el("section", { class: "wide" }, el("h2", {}, "Log (last lines)"),
      el("pre", { id: "log" }, t.log_tail ?? `(${t.log_error || "no log"})`)));
}

// ---------------------------------------------------------------- site page

/** A step line of grid carbon: the steps the broker kept (solid) and the site's forecast (dashed), with "now". */
function carbonChart(site) {
  const now = Date.now();
  const past = (site.carbon_history || []).map(([t, g]) => [t, g]);
  if (!past.length) past.push([now - 3600e3, site.carbon_g_per_kwh]);
  past.push([now, site.carbon_g_per_kwh]);
  const ahead = (site.carbon_forecast || []).map((g, i) => [site.carbon_forecast_start_ms + i * 3600e3, g])
    .filter(([t]) => t + 3600e3 > now);
  const all = past.concat(ahead);
  const t0 = Math.min(...all.map(([t]) => t));
  const t1 = Math.max(now, ...ahead.map(([t]) => t + 3600e3));
  const gmax = Math.max(100, ...all.map(([, g]) => g)) * 1.1;
  const W = 600;
  const H = 140;
  const x = (t) => (((t - t0) / Math.max(1, t1 - t0)) * (W - 40) + 36).toFixed(1);
  const y = (g) => (H - 16 - (g / gmax) * (H - 26)).toFixed(1);
  const steps = (pts, end) => pts.map(([t, g], i) => {
    const next = i + 1 < pts.length ? pts[i + 1][0] : end;
    return `${i ? "L" : "M"}${x(t)},${y(g)} L${x(next)},${y(g)}`;
  }).join(" ");
  return el("svg", { id: "carbon-chart", viewBox: `0 0 ${W} ${H}`, width: W, height: H },
    el("line", { class: "axis", x1: 36, y1: H - 16, x2: W - 4, y2: H - 16 }),
    el("text", { class: "tick", x: 2, y: Number(y(gmax / 1.1)) + 4 }, Math.round(gmax / 1.1)),
    el("text", { class: "tick", x: 2, y: H - 12 }, "0"),
    el("path", { class: "carbon-past", d: steps(past, now) }),
    ahead.length ? el("path", { class: "carbon-ahead", d: steps(ahead, t1) }) : null,
    el("line", { class: "now", x1: x(now), y1: 4, x2: x(now), y2: H - 16 }),
    el("text", { class: "tick", x: Number(x(now)) + 3, y: 12 }, "now"),
    el("text", { class: "tick", x: 36, y: H - 2 }, new Date(t0).toISOString().slice(0, 16).replace("T", " ") + " UTC"),
    el("text", { class: "tick", x: W - 140, y: H - 2 }, new Date(t1).toISOString().slice(0, 16).replace("T", " ") + " UTC"));
}

async function sitePage(id) {
  const [sites, running] = await Promise.all([
    api("/v1/sites"),
    api(`/v1/jobs?scope=live&site=${encodeURIComponent(id)}&limit=200&newest_first=true`),
  ]);
  const s = sites.find((x) => x.site === id);
  const main = document.getElementById("main");
  if (!s) {
    replace(main, el("section", { class: "wide", id: "site-page" }, el("p", {}, el("a", { href: "#/" }, "← federation")), el("p", { class: "error" }, `no site ${id}`)));
    return;
  }
  const d = devices(s);
  const pools = s.pools.map((p) =>
    el("tr", { "data-pool": p.name },
      el("td", {}, p.name), el("td", {}, p.kind), el("td", {}, p.model), el("td", { class: "num" }, p.count),
      el("td", { class: "num" }, (p.free_milli / 1000).toFixed(1)),
      el("td", { class: "num" }, `${p.count ? Math.round(100 * (1 - p.free_milli / 1000 / p.count)) : 0}%`),
      el("td", { class: "num" }, (p.price_micro_usd_per_hour / 1e6).toFixed(2))));
  const jobs = running.jobs.map((j) =>
    el("tr", { "data-job": j.job },
      el("td", {}, el("a", { href: `#/job/${encodeURIComponent(j.job)}`, class: "job-link" }, j.job)),
      el("td", {}, j.name || ""), el("td", {}, j.tenant), el("td", {}, el("span", { class: `pill ${j.phase}` }, j.phase)),
      el("td", {}, j.pool || "—"), el("td", { class: "num" }, j.estimate ? usd(j.estimate.cost_micro_usd) : "—")));
  const table = (heads, rows, empty) =>
    el("table", {}, el("thead", {}, el("tr", {}, heads.map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: heads.length, class: "muted" }, empty))));
  replace(main,
    el("section", { class: "wide", id: "site-page", "data-site": s.site },
      el("p", {}, el("a", { href: "#/" }, "← federation")),
      el("h2", {}, `${s.site} `, el("span", { class: "muted" }, `${s.tier} ${s.kind}${s.backend ? `, ${s.backend}` : ""}`), " ",
        el("span", { class: `pill ${s.up ? (s.draining ? "pending" : "running") : "failed"}` }, s.up ? (s.draining ? "draining" : "up") : "down")),
      el("p", {}, `${d.used.toFixed(1)} of ${d.count} devices in use (${d.count ? Math.round((100 * d.used) / d.count) : 0}%); PUE ${s.pue}; grid ${s.carbon_g_per_kwh} gCO2e/kWh now; at ${s.location.lat}, ${s.location.lon}; last heard ${ago(s.last_seen_ms)}`)),
    el("section", {}, el("h2", {}, "Pools"),
      table(["pool", "kind", "model", "devices", "free", "in use", "$/device-h"], pools, "no pools")),
    el("section", {}, el("h2", {}, "Grid carbon (gCO2e/kWh)"), carbonChart(s),
      el("p", { class: "muted" }, "solid: as the site advertised it, kept while work runs there; dashed: its forecast")),
    el("section", { class: "wide" }, el("h2", {}, `Live jobs here (${running.jobs.length}${running.next ? "+" : ""})`),
      table(["job", "name", "tenant", "state", "pool", "est. USD"], jobs, "no live jobs here")));
}

// ---------------------------------------------------------------- routing and refresh

function route() {
  const m = location.hash.match(/^#\/job\/(.+)$/);
  if (m) {
    return jobPage(decodeURIComponent(m[1])).catch(failed);
  }
  const s = location.hash.match(/^#\/site\/(.+)$/);
  if (s) {
    return sitePage(decodeURIComponent(s[1])).catch(failed);
  }
  overviewSkeleton();
  return refresh();
}

async function refresh() {
  if (location.hash.startsWith("#/job/")) return;
  if (location.hash.startsWith("#/site/")) return route();
  try {
    await load();
    drawSites();
    drawQueues();
    drawServices();
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
