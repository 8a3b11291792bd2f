// allot's dashboard: one page per question, each read from the API and read again when the change
// feed (GET /v1/watch) says something it shows has changed. No library, no build step: the
// daemon serves this file and the modules it imports (`resources.js`, `sse.js`) as they are.
//
// Invariants: every value written into the page goes through `esc` (the `h` template escapes
// what it is given); the API token lives in sessionStorage only (never in a URL); a page shows
// only what the API answers the caller, and an action only when /v1/whoami says it may.

import { parseResources } from "./resources.js";
import { EventStream } from "./sse.js";

const main = document.getElementById("main");
const liveBadge = document.getElementById("live");
const whoBadge = document.getElementById("who");

// ---- writing HTML safely ----

class Raw {
  constructor(text) { this.text = text; }
}
const raw = (text) => new Raw(text);
const esc = (value) =>
  String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const part = (value) =>
  value instanceof Raw ? value.text : Array.isArray(value) ? value.map(part).join("") : esc(value);
/** A template whose values are escaped unless they are `raw` (or made by `h`). */
const h = (strings, ...values) => raw(strings.reduce((out, s, i) => out + s + (i < values.length ? part(values[i]) : ""), ""));

// ---- the API ----

class ApiError extends Error {
  constructor(status, code, message) {
    super(message || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }
}
class NeedsToken extends Error {}

const tokenKey = "allot-token";
const token = () => sessionStorage.getItem(tokenKey);
const authHeaders = () => (token() ? { Authorization: `Bearer ${token()}` } : {});

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: { ...authHeaders(), ...(options.headers || {}) } });
  if (response.status === 401) throw new NeedsToken();
  const text = await response.text();
  const body = text ? JSON.parse(text) : null;
  // An ended alloc reads as 410 with its record.
  if (!response.ok && response.status !== 410) {
    throw new ApiError(response.status, body?.error?.code, body?.error?.message);
  }
  return body;
}

/** Every item of a paged list. */
async function all(path, field) {
  const items = [];
  let cursor = null;
  do {
    const sep = path.includes("?") ? "&" : "?";
    const page = await api(`${path}${sep}limit=1000${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
    items.push(...page[field]);
    cursor = page.next_cursor;
  } while (cursor);
  return items;
}

/** A list, or null when the caller may not read any of it. */
async function allowed(promise) {
  try {
    return await promise;
  } catch (err) {
    if (err instanceof ApiError && err.status === 403) return null;
    throw err;
  }
}

const seg = (name) => encodeURIComponent(name);

/** Which of `checks` (`use:namespace:hive:a`, ...) the caller may do. */
async function may(...checks) {
  const query = checks.map((c) => `can=${encodeURIComponent(c)}`).join("&");
  const answer = await api(`/v1/whoami${query ? `?${query}` : ""}`);
  return answer.can || {};
}

// ---- formatting ----

const units = [["d", 86400000], ["h", 3600000], ["min", 60000], ["s", 1000]];
function ms(value) {
  if (value === null || value === undefined) return "—";
  if (value < 1000) return `${value} ms`;
  for (const [unit, size] of units) {
    if (value >= size) {
      const n = value / size;
      return `${n >= 10 ? Math.round(n) : n.toFixed(1)} ${unit}`;
    }
  }
  return `${value} ms`;
}

/** A time of day to the millisecond, the browser's local time. */
const clock = (at) => `${new Date(at).toLocaleTimeString([], { hour12: false })}.${String(at % 1000).padStart(3, "0")}`;

/** `cpu=4,mem=16GiB` as units: {cpu: 4, mem: 17179869184}. */
function resources(text) {
  return Object.fromEntries(Object.entries(parseResources(text || "")).map(([name, milli]) => [name, milli / 1000]));
}
function amount(name, value) {
  if (/^(mem|memory|disk)$/.test(name) && value >= 1024) {
    const steps = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
    for (const [unit, size] of steps) if (value >= size) return `${+(value / size).toFixed(1)}${unit}`;
  }
  return `${+value.toFixed(3)}`;
}

/** A bar of `used` out of `of`, with the numbers in words beside it (one element drawn by CSS:
 * a page of a thousand rows lays out fast). */
function bar(used, of, label) {
  const share = of > 0 ? Math.min(used / of, 1) : used > 0 ? 1 : 0;
  const cls = share >= 1 ? "full" : share >= 0.8 ? "high" : "";
  return h`<span class="bar ${cls}" style="--share:${(share * 100).toFixed(1)}%">${label}</span>`;
}

/** One bar per resource of `capacity` (`used` of each). */
function bars(usedText, capacityText) {
  const used = resources(usedText);
  const capacity = resources(capacityText);
  const names = Object.keys(capacity);
  if (!names.length) return h`<span class="muted">${usedText || "—"}</span>`;
  return h`${names.map((n) => h`<div>${bar(used[n] || 0, capacity[n], `${n} ${amount(n, used[n] || 0)} / ${amount(n, capacity[n])}`)}</div>`)}`;
}

const tag = (kind, word) => h`<span class="tag ${kind}">${word}</span>`;
const stateTag = (state) => {
  const kind = { Completed: "ok", Running: "ok", Success: "ok", Failed: "bad", Rejected: "bad", Killed: "bad", Failing: "bad", Pending: "warn", Reserving: "warn", Accepted: "warn", Queued: "warn", Resuming: "warn" }[state] || "plain";
  return tag(kind, state);
};
/** How many rows a table shows until asked for all: a page of a thousand rows takes a browser
 * longer to lay out and paint than a person should wait. */
const ROWS = 200;
const showAll = new Set();

/** A table; a long one shows its first rows (the caller puts what needs attention first) and a
 * button for the rest, and is laid out by its header alone. */
function table(head, rows, empty = "none") {
  if (!rows.length) return h`<p class="muted">${empty}</p>`;
  const all = showAll.has(location.pathname) || rows.length <= ROWS;
  const shown = all ? rows : rows.slice(0, ROWS);
  const more = all ? "" : h`<p class="muted">Showing ${ROWS} of ${rows.length}. <button data-show-all>Show all ${rows.length}</button></p>`;
  const cells = head.map((c) => (c.startsWith("#") ? h`<th class="num">${c.slice(1)}</th>` : h`<th>${c}</th>`));
  return h`<div class="scroll"><table class="${rows.length > ROWS ? "long" : ""}"><thead><tr>${cells}</tr></thead><tbody>${shown}</tbody></table></div>${more}`;
}

/** `1 unit`, `2 units`: a count and its noun, singular or plural as the count needs. */
const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;
/** What the API says in words (a reason, why something waits): names it quotes in backticks
 * (pool `x`) shown as code, the rest escaped as any value. */
const prose = (text) => raw(esc(text).replace(/`([^`]*)`/g, "<code>$1</code>").replace(/`/g, ""));
/** A waiting reason: its code as a tag (in red for what will not run as things are), its
 * message in words. */
const waitingText = (waiting) => h`${tag(STRANDED[waiting.code] ? "bad" : "warn", waiting.code)} ${prose(waiting.message)}`;

const facts = (pairs) => h`<dl class="facts">${pairs.map(([k, v]) => h`<dt>${k}</dt><dd>${v}</dd>`)}</dl>`;
const denied = (what) => h`<p class="muted">You may not read ${what}.</p>`;
const tasksLine = (counts) =>
  Object.entries(counts || {}).map(([state, n]) => `${n} ${state}`).join(", ") || "none";

// ---- pages: each answers {title, nav, body, watch: key prefixes that change it, bind?, again?:
// ms until it is shown again, for what the change feed does not announce} ----

/** Waiting codes of what will not run as things are: placed where no daemon runs it, or too
 * large for anything it may use. The overview lists them first, with the word of its tag. */
const STRANDED = { pool_not_run: "stranded", not_run: "stranded", type_not_run: "stranded", can_never_fit: "never fits" };
/** The most applications whose tasks the overview reads to find stranded ones (the longest
 * waiting first): the page stays quick with many applications. */
const STRANDED_READS = 50;

const ended = (state) => ["Completed", "Failed", "Rejected"].includes(state);

/** The live applications that hold stranded tasks, or are stranded themselves: [app, why, word]. */
async function strandedApps(apps) {
  const stranded = [];
  const toRead = [];
  for (const app of apps.filter((a) => !ended(a.state))) {
    if (app.waiting && STRANDED[app.waiting.code]) stranded.push([app, prose(app.waiting.message), STRANDED[app.waiting.code]]);
    else if ((app.tasks || {}).Pending || (app.tasks || {}).Allocated) toRead.push(app);
  }
  toRead.sort((a, b) => (b.submitted_ms_ago || 0) - (a.submitted_ms_ago || 0));
  const read = await Promise.all(toRead.slice(0, STRANDED_READS).map((a) => allowed(all(`/v1/apps/${seg(a.id)}/tasks`, "tasks"))));
  toRead.slice(0, STRANDED_READS).forEach((app, i) => {
    const tasks = (read[i] || []).filter((t) => t.waiting && STRANDED[t.waiting.code]);
    if (!tasks.length) return;
    const word = STRANDED[tasks[0].waiting.code];
    stranded.push([app, h`${plural(tasks.length, "task")} ${word} (<a href="/ui/apps/${seg(app.id)}/tasks/${seg(tasks[0].id)}">${tasks[0].id}</a>: ${prose(tasks[0].waiting.message)})`, word]);
  });
  return stranded;
}

async function overview() {
  const [namespaces, pools, queues, apps] = await Promise.all([
    allowed(all("/v1/namespaces", "namespaces")),
    allowed(all("/v1/pools", "pools")),
    allowed(api("/v1/queues").then((q) => q.queues)),
    allowed(all("/v1/apps", "apps")),
  ]);
  const attention = [];
  for (const ns of namespaces || []) {
    if (ns.waiters > 0) {
      const full = ns.granted_units >= ns.quota;
      attention.push([ns.longest_wait_ms || 0, h`${tag(full ? "bad" : "warn", full ? "full" : "waiting")} namespace <a href="/ui/namespaces/${seg(ns.name)}">${ns.name}</a>: ${ns.granted_units} of ${ns.quota} granted, ${ns.waiters} waiting (the longest for ${ms(ns.longest_wait_ms)})`]);
    }
  }
  for (const pool of pools || []) {
    if (pool.stopped) attention.push([1e12, h`${tag("bad", "stopped")} pool <a href="/ui/pools/${seg(pool.name)}">${pool.name}</a> is stopped: it offers nothing`]);
    else if (pool.cordon) attention.push([pool.cordon.since_ms_ago, h`${poolState(pool)} pool <a href="/ui/pools/${seg(pool.name)}">${pool.name}</a>: nothing new is placed there${pool.cordon.drain_in_ms === undefined || pool.cordon.drain_in_ms === null ? "" : pool.cordon.drain_in_ms > 0 ? `; its tasks are preempted in ${ms(pool.cordon.drain_in_ms)}` : "; its tasks are being preempted"}`]);
    if (pool.expired_allocs > 0) attention.push([1e11, h`${tag("warn", "lapsed")} pool <a href="/ui/pools/${seg(pool.name)}">${pool.name}</a>: ${plural(pool.expired_allocs, "alloc")} whose lease lapsed (${pool.expired || "nothing"} not yet reclaimed)`]);
  }
  // Stranded or never fitting: first, for they will not end by waiting.
  const stranded = await strandedApps(apps || []);
  for (const [app, why, word] of stranded) {
    attention.push([2e12 + (app.submitted_ms_ago || 0), h`${tag("bad", word)} application <a href="/ui/apps/${seg(app.id)}">${app.id}</a>: ${why}`]);
  }
  // Waiting: the application itself (a gang, a queue limit), or tasks of it not placed yet.
  const strandedIds = new Set(stranded.map(([app]) => app.id));
  const pendingOf = (a) => (a.tasks || {}).Pending || 0;
  const waitingApps = (apps || [])
    .filter((a) => !ended(a.state) && !strandedIds.has(a.id) && (a.waiting || pendingOf(a) > 0))
    .sort((a, b) => (b.submitted_ms_ago || 0) - (a.submitted_ms_ago || 0));
  for (const app of waitingApps.slice(0, 10)) {
    const why = app.waiting ? prose(app.waiting.message) : `${plural(pendingOf(app), "task waits", "tasks wait")} to be placed (the page says why)`;
    attention.push([app.submitted_ms_ago || 0, h`${tag("warn", "waiting")} application <a href="/ui/apps/${seg(app.id)}">${app.id}</a> for ${ms(app.submitted_ms_ago)}: ${why}`]);
  }
  for (const app of apps || []) {
    const failed = (app.tasks || {}).Failed || 0;
    if (failed) attention.push([0, h`${tag("bad", "failed")} application <a href="/ui/apps/${seg(app.id)}">${app.id}</a>: ${plural(failed, "task")} failed`]);
  }
  attention.sort((a, b) => b[0] - a[0]);
  /** A card: how many, or — when the caller may not read the list. */
  const card = (href, list, one, many, more) =>
    h`<a class="card" href="${href}"><div class="n">${list === null ? "—" : list.length}</div><div class="k">${list !== null && list.length === 1 ? one : many}${more}</div></a>`;
  const running = (apps || []).filter((a) => a.state === "Running").length;
  const granted = (namespaces || []).reduce((s, n) => s + n.granted_units, 0);
  const waiting = (namespaces || []).reduce((s, n) => s + n.waiters, 0);
  const allocs = (pools || []).reduce((s, p) => s + p.allocs, 0);
  return {
    title: "Overview",
    nav: "overview",
    watch: [""],
    body: h`<h1>Overview</h1>
      <div class="cards">
        ${card("/ui/namespaces", namespaces, "namespace", "namespaces", ` · ${plural(granted, "unit")} granted · ${waiting} waiting`)}
        ${card("/ui/pools", pools, "pool", "pools", ` · ${plural(allocs, "alloc")}`)}
        ${card("/ui/queues", queues, "queue", "queues", "")}
        ${card("/ui/apps", apps, "application", "applications", ` · ${running} running`)}
      </div>
      <h2>Needs attention</h2>
      ${attention.length ? h`<ul class="attention">${attention.map(([, item]) => h`<li>${item}</li>`)}</ul>` : h`<p>${tag("ok", "all clear")} Nothing waits, nothing lapsed, nothing failed.</p>`}`,
  };
}

async function namespacesPage() {
  const list = await allowed(all("/v1/namespaces", "namespaces"));
  if (list === null) return { title: "Namespaces", nav: "namespaces", watch: [], body: h`<h1>Namespaces</h1>${denied("any namespace")}` };
  // Those with waiters first (the longest wait first), then the fullest.
  const order = (ns) => [ns.waiters > 0 ? 1 : 0, ns.longest_wait_ms || 0, ns.quota ? ns.granted_units / ns.quota : 0];
  const sorted = [...list].sort((a, b) => {
    const [x, y] = [order(a), order(b)];
    return y[0] - x[0] || y[1] - x[1] || y[2] - x[2] || (a.name < b.name ? -1 : 1);
  });
  const rows = sorted.map((ns) => {
    const full = ns.granted_units >= ns.quota && ns.quota > 0;
    const state = ns.waiters > 0 ? tag(full ? "bad" : "warn", full ? "full, waiting" : "waiting") : full ? tag("warn", "full") : tag("ok", "room");
    return h`<tr><td><a href="/ui/namespaces/${seg(ns.name)}">${ns.name}</a></td><td>${bar(ns.granted_units, ns.quota, `${ns.granted_units} / ${ns.quota}`)}</td><td class="num">${ns.grants}</td><td class="num">${ns.waiters}</td><td class="num">${ns.waiters ? ms(ns.longest_wait_ms) : "—"}</td><td>${state}</td></tr>`;
  });
  return {
    title: "Namespaces",
    nav: "namespaces",
    watch: ["namespaces/"],
    body: h`<h1>Namespaces</h1><p class="muted">${plural(list.length, "namespace")}: their quota, what is granted and who waits.</p>
      ${table(["Namespace", "Granted of quota", "#Grants", "#Waiters", "#Longest wait", "State"], rows, "No namespace yet.")}`,
  };
}

async function namespacePage(name) {
  const [ns, grants, waiters, can] = await Promise.all([
    api(`/v1/namespaces/${seg(name)}`),
    all(`/v1/namespaces/${seg(name)}/grants`, "grants"),
    all(`/v1/namespaces/${seg(name)}/waiters`, "waiters"),
    may(`use:namespace:${name}`),
  ]);
  const canRelease = can[`use:namespace:${name}`];
  const scopes = {};
  for (const g of grants) {
    if (!g.scope) continue;
    scopes[`project ${g.scope.project}`] = (scopes[`project ${g.scope.project}`] || 0) + g.units;
    const key = `namespace scope ${g.scope.project}/${g.scope.namespace}`;
    scopes[key] = (scopes[key] || 0) + g.units;
  }
  const waiterRows = waiters.map((w) => h`<tr><td class="num">${w.position}</td><td class="mono">${w.token}</td><td class="num">${w.units}</td><td class="num">${w.units_ahead}</td><td>${w.scope ? `${w.scope.project}/${w.scope.namespace}` : "—"}</td><td class="num">${ms(w.waited_ms)}</td><td>${w.blocked_by_cap ? tag("warn", `held by its ${w.blocked_by_cap} cap`) : tag("plain", "in line")}</td></tr>`);
  const grantRows = grants.map((g) => h`<tr><td class="mono">${g.token}</td><td class="num">${g.units}</td><td>${g.scope ? `${g.scope.project}/${g.scope.namespace}` : "—"}</td><td class="num">${g.fencing}</td><td>${g.session ? h`session <span class="mono">${g.session.slice(0, 8)}</span>` : g.expires_in_ms === null || g.expires_in_ms === undefined ? "no lease" : `expires in ${ms(g.expires_in_ms)}`}</td><td>${canRelease ? h`<button class="danger" data-release="${g.token}" data-fencing="${g.fencing}">Release</button>` : ""}</td></tr>`);
  const full = ns.granted_units >= ns.quota && ns.quota > 0;
  return {
    title: `Namespace ${name}`,
    nav: "namespaces",
    watch: [`namespaces/${name}`],
    body: h`<div class="crumbs"><a href="/ui/namespaces">Namespaces</a> /</div><h1>${name}</h1>
      ${facts([
        ["granted", bar(ns.granted_units, ns.quota, `${ns.granted_units} of ${plural(ns.quota, "unit")}${full ? " — full" : ""}`)],
        ["grants", ns.grants],
        ["waiting", ns.waiters ? h`${tag("warn", `${ns.waiters} waiting`)} for ${plural(ns.waiting_units, "unit")}, the longest for ${ms(ns.longest_wait_ms)}` : "nobody"],
        ["next fencing number", ns.next_fencing],
      ])}
      <h2>Waiting, first come first served</h2>${table(["#Place", "Token", "#Units", "#Units ahead", "Scope", "#Waited", "State"], waiterRows, "Nobody waits.")}
      <h2>Caps in use</h2>${Object.keys(scopes).length ? table(["Scope", "#Units held"], Object.entries(scopes).map(([k, v]) => h`<tr><td>${k}</td><td class="num">${v}</td></tr>`)) : h`<p class="muted">No grant names a scope.</p>`}
      <h2>Grants</h2>${table(["Token", "#Units", "Scope", "#Fencing", "Lease", ""], grantRows, "Nothing granted.")}`,
    bind: () =>
      main.querySelectorAll("[data-release]").forEach((button) =>
        button.addEventListener("click", () =>
          act(`Release grant ${button.dataset.release} of ${name}?`, () =>
            api(`/v1/namespaces/${seg(name)}/grants/${seg(button.dataset.release)}?fencing=${button.dataset.fencing}`, { method: "DELETE" }),
          ),
        ),
      ),
  };
}

/** The daemons that run a pool's tasks (`run_by`, their URLs), or that none does; a daemon too
 * old to say gives no `run_by`, and nothing is shown. */
const runBy = (pool) =>
  pool.run_by.length ? h`${pool.run_by.map((url, i) => h`${i ? ", " : ""}<span class="mono">${url}</span>`)}` : tag("bad", "no daemon runs it");

async function poolsPage() {
  const list = await allowed(all("/v1/pools", "pools"));
  if (list === null) return { title: "Pools", nav: "pools", watch: [], body: h`<h1>Pools</h1>${denied("any pool")}` };
  const said = list.some((p) => Array.isArray(p.run_by));
  const rows = list.map((p) => h`<tr><td><a href="/ui/pools/${seg(p.name)}">${p.name}</a></td><td>${poolState(p)}</td>${said ? h`<td>${Array.isArray(p.run_by) ? runBy(p) : "—"}</td>` : ""}<td>${bars(p.allocated, p.capacity)}</td><td class="num">${p.allocs}</td><td class="num">${p.expired_allocs ? tag("warn", `${p.expired_allocs} lapsed`) : 0}</td><td>${Object.entries(p.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "—"}</td></tr>`);
  return {
    title: "Pools",
    nav: "pools",
    watch: ["pools/"],
    body: h`<h1>Pools</h1><p class="muted">${plural(list.length, "pool")}: what each can give, and what is allocated of it.</p>
      ${table(["Pool", "State", ...(said ? ["Run by"] : []), "Allocated of capacity", "#Allocs", "#Lapsed", "Labels"], rows, "No pool yet.")}`,
  };
}


// What an alloc has in it: the task (or gang placeholder) the scheduler holds it for, else its
// owner's labels and metadata.
function allocHolds(a) {
  if (a.task && a.task.task) return h`task <a href="/ui/apps/${seg(a.task.app)}/tasks/${seg(a.task.task)}">${a.task.task}</a> of <a href="/ui/apps/${seg(a.task.app)}">${a.task.app}</a>`;
  if (a.task) return h`placeholder ${a.task.placeholder || "?"} of <a href="/ui/apps/${seg(a.task.app)}">${a.task.app}</a>`;
  const labels = Object.entries(a.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ");
  const metadata = a.metadata ? JSON.stringify(a.metadata) : "";
  const shown = metadata.length > 120 ? `${metadata.slice(0, 119)}…` : metadata;
  if (!labels && !shown) return "—";
  return h`${labels}${labels && shown ? " " : ""}${shown ? h`<span class="mono" title="${metadata}">${shown}</span>` : ""}`;
}
async function poolPage(name) {
  const [pool, allocs, can] = await Promise.all([
    api(`/v1/pools/${seg(name)}`),
    all(`/v1/pools/${seg(name)}/allocs`, "allocs"),
    may(`use:pool:${name}`, `admin:pool:${name}`),
  ]);
  const canFree = can[`use:pool:${name}`];
  const canOrder = can[`admin:pool:${name}`];
  const orders = !canOrder
    ? ""
    : pool.cordon
      ? h`<p><button data-order="uncordon">Uncordon</button>${pool.cordon.drain_in_ms === undefined || pool.cordon.drain_in_ms === null ? h` <button class="danger" data-order="drain">Drain</button>` : ""}</p>`
      : h`<p><button data-order="cordon">Cordon</button> <button class="danger" data-order="drain">Drain</button></p>`;
  const rows = allocs.map((a) => h`<tr><td class="mono">${a.id}</td><td>${a.owner || "—"}</td><td>${allocHolds(a)}</td><td>${a.resources}</td><td>${a.held_by === "scheduler" ? "held by the scheduler" : a.expires_in_ms === null || a.expires_in_ms === undefined ? "—" : a.expires_in_ms <= 0 ? tag("warn", "lapsed") : `expires in ${ms(a.expires_in_ms)}`}</td><td class="num">${ms(a.created_ms_ago)}</td><td>${canFree && a.held_by !== "scheduler" ? h`<button class="danger" data-free="${a.id}">Free</button>` : ""}</td></tr>`);
  return {
    title: `Pool ${name}`,
    nav: "pools",
    watch: [`pools/${name}`],
    body: h`<div class="crumbs"><a href="/ui/pools">Pools</a> /</div><h1>${name}</h1>
      ${facts([
        ["state", poolState(pool)],
        ...(pool.cordon ? [["cordoned", `${ms(pool.cordon.since_ms_ago)} ago${pool.cordon.drain_in_ms === undefined || pool.cordon.drain_in_ms === null ? "" : `; drained: its tasks ${pool.cordon.drain_in_ms > 0 ? `are preempted in ${ms(pool.cordon.drain_in_ms)}` : "are preempted (those that may not be, and gang members, run to their end)"}`}`]] : []),
        ["occupied", pool.occupied ? h`${pool.occupied} <span class="muted">(held by things allot does not manage)</span>` : "nothing"],
        ...(Array.isArray(pool.run_by) ? [["run by", runBy(pool)]] : []),
        ["allocated", bars(pool.allocated, pool.capacity)],
        ["capacity", pool.capacity],
        ["labels", Object.entries(pool.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "none"],
        ["lapsed", pool.expired_allocs ? h`${tag("warn", plural(pool.expired_allocs, "alloc"))} (${pool.expired})` : "none"],
        ["since start", `${pool.stats.accepted} accepted, ${pool.stats.freed} freed, ${pool.stats.reclaimed} reclaimed`],
      ])}
      ${orders}
      <h2>Allocs</h2>${table(["Alloc", "Owner", "In it", "Resources", "Lease", "#Age", ""], rows, "No alloc.")}`,
    bind: () => {
      main.querySelectorAll("[data-free]").forEach((button) =>
        button.addEventListener("click", () =>
          act(`Free alloc ${button.dataset.free} of pool ${name}?`, () => api(`/v1/pools/${seg(name)}/allocs/${seg(button.dataset.free)}`, { method: "DELETE" })),
        ),
      );
      const asks = {
        cordon: `Cordon pool ${name}? Nothing new is placed there; what runs there runs on.`,
        drain: `Drain pool ${name}? Its tasks are preempted in 30 s and placed again elsewhere.`,
        uncordon: `Uncordon pool ${name}? It takes allocs again.`,
      };
      main.querySelectorAll("[data-order]").forEach((button) =>
        button.addEventListener("click", () =>
          act(asks[button.dataset.order], () => api(`/v1/pools/${seg(name)}/${button.dataset.order}`, { method: "POST" })),
        ),
      );
    },
  };
}

async function queuesPage() {
  const list = await allowed(api("/v1/queues").then((q) => q.queues));
  if (list === null) return { title: "Queues", nav: "queues", watch: [], body: h`<h1>Queues</h1>${denied("any queue")}` };
  const rows = list.map((q) => {
    const depth = q.path.split(".").length - 1;
    const used = resources(q.used);
    const guaranteed = resources(q.guaranteed);
    const over = Object.keys(guaranteed).some((r) => (used[r] || 0) > guaranteed[r]);
    const limit = q.max || q.guaranteed;
    const apps = `/ui/apps?queue=${encodeURIComponent(q.path)}`;
    return h`<tr><td><span class="indent" style="padding-left:${depth * 16}px"><a href="${apps}">${q.path.split(".").pop()}</a></span> <span class="muted mono hide-narrow">${q.path}</span></td>
      <td>${limit ? bars(q.used, limit) : h`<span class="muted">${q.used || "nothing"}</span>`}${over ? h`<div>${tag("warn", "over its guarantee")}</div>` : ""}</td>
      <td>${q.guaranteed || "—"}</td><td>${q.max || "no max"}</td>
      <td class="num">${q.running_apps}${q.max_apps ? ` / ${q.max_apps}` : ""}</td><td class="num"><a href="${apps}">${q.apps}</a></td><td class="num">${q.pending_tasks}</td></tr>`;
  });
  return {
    title: "Queues",
    nav: "queues",
    watch: ["queues/", "apps/"],
    body: h`<h1>Queues</h1><p class="muted">The queue tree: what each queue is guaranteed, may use at most, and uses; a queue leads to its applications.</p>
      ${table(["Queue", "Used", "Guaranteed", "Max", "#Running apps", "#Apps", "#Pending tasks"], rows)}`,
  };
}

/** The applications; with `?queue=root.x`, those of that queue and the queues below it. */
async function appsPage() {
  const queue = new URLSearchParams(location.search).get("queue");
  const list = await allowed(all("/v1/apps", "apps"));
  if (list === null) return { title: "Applications", nav: "apps", watch: [], body: h`<h1>Applications</h1>${denied("any application")}` };
  const shown = queue === null ? list : list.filter((a) => a.queue === queue || a.queue.startsWith(`${queue}.`));
  const rows = shown.map((a) => h`<tr><td><a href="/ui/apps/${seg(a.id)}">${a.id}</a></td><td>${stateTag(a.state)}</td><td><a href="/ui/apps?queue=${encodeURIComponent(a.queue)}">${a.queue}</a></td><td>${a.user}</td><td>${tasksLine(a.tasks)}</td><td>${a.waiting ? waitingText(a.waiting) : "—"}</td><td class="num">${ms(a.submitted_ms_ago)}</td></tr>`);
  const head = queue === null
    ? h`<h1>Applications</h1><p class="muted">${plural(list.length, "application")}.</p>`
    : h`<div class="crumbs"><a href="/ui/queues">Queues</a> /</div><h1>Applications in ${queue}</h1>
      <p class="muted">${plural(shown.length, "application")} in queue ${queue} and the queues below it; <a href="/ui/apps">all ${plural(list.length, "application")}</a>.</p>`;
  return {
    title: queue === null ? "Applications" : `Applications in ${queue}`,
    nav: "apps",
    watch: ["apps/"],
    body: h`${head}${table(["Application", "State", "Queue", "User", "Tasks", "Why it waits", "#Age"], rows, queue === null ? "No application yet." : "No application in this queue.")}`,
  };
}

const where = (placement) => (placement ? h`<span class="mono">${placement.uri}</span> <span class="muted">${placement.resources}</span>` : "—");

async function appPage(id) {
  const [app, tasks] = await Promise.all([api(`/v1/apps/${seg(id)}`), all(`/v1/apps/${seg(id)}/tasks`, "tasks")]);
  const can = await may(`use:queue:${app.queue}`);
  const groups = (app.task_groups || []).map((g) => {
    const held = (app.placeholders || []).filter((p) => p.group === g.name);
    const state = held.length >= g.min_members ? tag("ok", "reserved") : held.length ? tag("warn", `${held.length} of ${g.min_members} reserved`) : tag("warn", "not reserved");
    return h`<tr><td>${g.name}</td><td class="num">${g.min_members}</td><td>${g.min_resources}</td><td>${state}</td><td>${held.map((p) => h`<div>${p.group}#${p.member + 1}: ${where(p.placement)}${p.task ? h` — taken by <a href="/ui/apps/${seg(id)}/tasks/${seg(p.task)}">${p.task}</a>` : ""}</div>`)}</td></tr>`;
  });
  const rows = tasks.map((t) => h`<tr><td><a href="/ui/apps/${seg(id)}/tasks/${seg(t.id)}">${t.id}</a></td><td>${stateTag(t.state)}</td><td>${t.resources}</td><td>${t.group || "—"}</td><td>${where(t.placement)}</td><td>${t.preempting ? preemption(t) : t.waiting ? waitingText(t.waiting) : t.reason ? prose(t.reason) : "—"}</td></tr>`);
  return {
    title: `Application ${id}`,
    nav: "apps",
    watch: [`apps/${id}`],
    body: h`<div class="crumbs"><a href="/ui/apps">Applications</a> /</div><h1>${id} ${stateTag(app.state)}</h1>
      ${facts([
        ["queue", h`<a href="/ui/apps?queue=${encodeURIComponent(app.queue)}">${app.queue}</a>${app.queue_rule ? h` <span class="muted">(placed by rule ${app.queue_rule})</span>` : ""}`],
        ["user", `${app.user}${app.user_groups && app.user_groups.length ? ` (${app.user_groups.join(", ")})` : ""}`],
        ["tasks", tasksLine(app.tasks)],
        ["waiting", app.waiting ? waitingText(app.waiting) : "no"],
        ["reason", app.reason ? prose(app.reason) : "—"],
        ["submitted", `${ms(app.submitted_ms_ago)} ago`],
        ["placeholders expire in", app.placeholders_expire_in_ms === null || app.placeholders_expire_in_ms === undefined ? "—" : ms(app.placeholders_expire_in_ms)],
      ])}
      ${can[`use:queue:${app.queue}`] && !ended(app.state) ? h`<p><button class="danger" id="remove-app">Remove this application</button></p>` : ""}
      ${groups.length ? h`<h2>Task groups (gangs)</h2>${table(["Group", "#Members", "Each holds", "Reservation", "Placeholders"], groups)}` : ""}
      <h2>Tasks</h2>${table(["Task", "State", "Resources", "Group", "Runs on", "Why it waits / why it ended"], rows, "No task yet.")}`,
    bind: () => {
      const button = document.getElementById("remove-app");
      if (button) button.addEventListener("click", () => act(`Remove application ${id}? Its tasks end and everything it holds is released.`, () => api(`/v1/apps/${seg(id)}`, { method: "DELETE" })));
    },
  };
}

/** How many lines of each log a task's page shows: its end. */
const LOG_LINES = 200;
/** The most pieces of a log (256 KiB each) read for one showing: a long log is caught up with
 * over a few showings. */
const LOG_PIECES = 8;
/** While a task runs, how often its page is shown again: its log grows without a change on the
 * change feed. */
const FOLLOW_MS = 1000;

/** The end of `text` that holds its last `n` lines. */
function lastLines(text, n) {
  let at = text.length - (text.endsWith("\n") ? 1 : 0);
  for (let i = 0; i < n; i++) {
    at = text.lastIndexOf("\n", at - 1);
    if (at < 0) return text;
  }
  return text.slice(at + 1);
}

/** The logs of the task whose page is shown, as read so far: each read goes on from where the
 * last one ended (`next_offset`), for the attempt it was read for. */
let followed = { task: null, streams: {} };

/** The end of one log of a task's attempt, read on from where the last read ended; null when
 * the attempt has no such log (or it is on a daemon that cannot be asked). */
async function logEnd(app, task, stream, attempt) {
  const key = JSON.stringify([app, task]);
  if (followed.task !== key) followed = { task: key, streams: {} };
  let kept = followed.streams[stream];
  if (!kept || kept.attempt !== attempt) kept = { attempt, offset: 0, text: "" };
  try {
    for (let i = 0; i < LOG_PIECES; i++) {
      const piece = await api(`/v1/apps/${seg(app)}/tasks/${seg(task)}/logs?stream=${seg(stream)}&attempt=${attempt}&offset=${kept.offset}`);
      if (piece.next_offset === kept.offset) break;
      kept = { attempt, offset: piece.next_offset, text: lastLines(kept.text + piece.text, LOG_LINES) };
    }
  } catch (err) {
    if (!(err instanceof ApiError) || err.status === 403) throw err;
    return null;
  }
  followed.streams[stream] = kept;
  return kept;
}

/** A run's phase as its user reads it: ended on a retryable failure, no retry left, it failed
 * for good (as `allot task show` says). */
function runPhase(run) {
  const failed = "failed: ";
  const cause = run.stage === "ended" && run.phase === "RetryableFailure" && run.ending?.startsWith(failed) ? run.ending.slice(failed.length) : null;
  return cause === null ? stateTag(run.phase) : h`${tag("bad", "Failed")} (retryable failure, no retries left: ${prose(cause)})`;
}

/** A pool's state: stopped, drained or draining, cordoned, or offering. */
function poolState(pool) {
  if (pool.stopped) return tag("bad", "stopped");
  if (!pool.cordon) return tag("ok", "offering");
  const drain = pool.cordon.drain_in_ms;
  if (drain === undefined || drain === null) return tag("warn", "cordoned");
  return drain > 0 ? tag("warn", `draining in ${ms(drain)}`) : tag("bad", "drained");
}

/** Who preempts a task and why, or how often it was preempted. */
function preemption(task) {
  const p = task.preempting;
  if (p) {
    const by = p.by ? h`for <a href="/ui/apps/${seg(p.by.split("/")[0])}/tasks/${seg(p.by.split("/").slice(1).join("/"))}">${p.by}</a>` : "by its pool";
    return h`${tag("warn", "being preempted")} ${by}, ${ms(p.since_ms_ago)} ago: ${prose(p.reason)}`;
  }
  return task.preemptions ? `${plural(task.preemptions, "time")} before` : "never";
}

const jsonBlock = (value) => h`<pre class="logs">${JSON.stringify(value, null, 2)}</pre>`;

/** A plugin's log links: a link where the address is http(s), its text otherwise (never a
 *  `javascript:` link). */
const logLinks = (logs) =>
  logs.map((l, i) => h`${i ? ", " : ""}${/^https?:\/\//i.test(l.uri) ? h`<a href="${l.uri}" rel="noopener noreferrer" target="_blank">${l.name}</a>` : h`${l.name} <span class="mono">${l.uri}</span>`}`);

async function taskPage(id, taskId) {
  const task = await api(`/v1/apps/${seg(id)}/tasks/${seg(taskId)}`);
  let run = null;
  const logs = {};
  // A run exists once the task was placed where a daemon runs it; its logs are read on that
  // daemon.
  if (task.placement && !(task.waiting && STRANDED[task.waiting.code])) {
    try {
      run = await api(`/v1/apps/${seg(id)}/tasks/${seg(taskId)}/run`);
    } catch (err) {
      if (!(err instanceof ApiError) || err.status === 403) throw err;
    }
  }
  // Logs the daemon keeps in files (the shell plugin's): read only those the attempt has.
  const fileLog = (l) => l.uri.startsWith("file://");
  const kept = (stream) => run.events.some((e) => e.attempt === run.attempt && (e.logs || []).some((l) => l.name === stream && fileLog(l)));
  if (run) {
    [logs.stderr, logs.stdout] = await Promise.all(["stderr", "stdout"].map((s) => (kept(s) ? logEnd(id, taskId, s, run.attempt) : null)));
  }
  // What a plugin told of an event (Flyte's TaskInfo): when it really happened, its log links,
  // its custom information.
  const told = (e) => h`${e.occurred_at_ms !== undefined && e.occurred_at_ms !== null ? h`<div class="muted">began ${clock(e.occurred_at_ms)} (${ms(e.at_ms - e.occurred_at_ms)} before it was seen)</div>` : ""}${(e.logs || []).some((l) => !fileLog(l)) ? h`<div>logs: ${logLinks(e.logs.filter((l) => !fileLog(l)))}</div>` : ""}${e.custom_info ? h`<div class="mono" data-custom-info>${JSON.stringify(e.custom_info)}</div>` : ""}`;
  const events = run ? run.events.map((e) => h`<tr><td class="mono">${clock(e.at_ms)}</td><td class="num">${e.attempt}</td><td>${stateTag(e.phase)}${e.version ? ` v${e.version}` : ""}</td><td>${e.reason ? prose(e.reason) : ""}${e.error ? h` <span class="error">${e.error.code}: ${prose(e.error.message)}</span>` : ""}${told(e)}</td></tr>`) : [];
  const log = (stream, what) => {
    const kept = logs[stream];
    if (!kept) return "";
    return h`<h2>${what}${run && run.attempt > 1 ? ` (attempt ${run.attempt})` : ""}</h2>${kept.text ? h`<pre class="logs" data-log="${stream}">${kept.text}</pre>` : h`<p class="muted">Nothing written.</p>`}`;
  };
  // Until its task and run end, a run's logs may grow: the page is shown again every FOLLOW_MS.
  const going = run !== null && (!["Completed", "Failed", "Killed", "Rejected"].includes(task.state) || run.stage !== "ended");
  return {
    title: `Task ${taskId} of ${id}`,
    nav: "apps",
    watch: [`apps/${id}/tasks/${taskId}`, `runs/${id}/${taskId}`],
    again: going ? FOLLOW_MS : 0,
    body: h`<div class="crumbs"><a href="/ui/apps">Applications</a> / <a href="/ui/apps/${seg(id)}">${id}</a> /</div><h1>${taskId} ${stateTag(task.state)}</h1>
      ${facts([
        ["resources", task.resources],
        ["tokens", (task.tokens || []).map((t) => `${t.namespace}=${t.units}`).join(", ") || "none"],
        ["runs on", where(task.placement)],
        ["waiting", task.waiting ? waitingText(task.waiting) : "no"],
        ["reason", task.reason ? prose(task.reason) : "—"],
        ["priority", `${task.priority}${task.priority_class ? ` (${task.priority_class})` : ""}${task.preemptable === false ? ", may not be preempted" : ""}`],
        ["preempted", preemption(task)],
      ])}
      <h2>Run</h2>
      ${run ? h`${facts([["phase", runPhase(run)], ["attempt", run.attempt], ["failures", `${run.user_failures} user, ${run.system_failures} system`]])}${table(["Time", "#Attempt", "Phase", "What happened"], events, "No event yet.")}` : h`<p class="muted">No run here: the task has not started on this daemon's pools.</p>`}
      ${log("stderr", "stderr (its end)")}
      ${log("stdout", "stdout (its end)")}
      <h2>Outputs</h2>${run && run.outputs !== undefined && run.outputs !== null ? jsonBlock(run.outputs) : h`<p class="muted">None${run && run.stage !== "ended" ? " yet" : ""}.</p>`}
      <h2>Spec</h2>${task.spec !== undefined && task.spec !== null ? jsonBlock(task.spec) : h`<p class="muted">None: a worker outside allot runs this task.</p>`}`,
    // A log shows its end, where it grows.
    bind: () => main.querySelectorAll("[data-log]").forEach((pre) => (pre.scrollTop = pre.scrollHeight)),
  };
}

const routes = [
  [/^\/ui\/?$/, overview],
  [/^\/ui\/namespaces\/?$/, namespacesPage],
  [/^\/ui\/namespaces\/([^/]+)$/, namespacePage],
  [/^\/ui\/pools\/?$/, poolsPage],
  [/^\/ui\/pools\/([^/]+)$/, poolPage],
  [/^\/ui\/queues\/?$/, queuesPage],
  [/^\/ui\/apps\/?$/, appsPage],
  [/^\/ui\/apps\/([^/]+)$/, appPage],
  [/^\/ui\/apps\/([^/]+)\/tasks\/([^/]+)$/, taskPage],
];

// ---- showing a page, and showing it again ----

let current = { watch: [] };
let showing = null;
/** The next showing of a page that follows something the change feed does not announce (a
 * running task's log); a page shown replaces it. */
let again = null;

async function show({ keepScroll = false } = {}) {
  const started = performance.now();
  const path = location.pathname;
  const route = routes.find(([pattern]) => pattern.test(path));
  const scroll = window.scrollY;
  let page;
  try {
    if (!route) throw new ApiError(404, "not_found", `No page at ${path}.`);
    const params = route[0].exec(path).slice(1).map(decodeURIComponent);
    page = await route[1](...params);
  } catch (err) {
    if (err instanceof NeedsToken) return login();
    page = { title: "Not shown", nav: "", watch: [], body: h`<h1>Not shown</h1><p class="error">${err instanceof ApiError ? h`${err.code || err.status}: ${prose(err.message)}` : String(err)}</p><p><a href="/ui">Back to the overview</a></p>` };
  }
  current = page;
  document.title = `${page.title} · allot`;
  main.innerHTML = page.body.text;
  for (const link of document.querySelectorAll("[data-nav]")) {
    if (link.dataset.nav === page.nav) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (page.bind) page.bind();
  clearTimeout(again);
  if (page.again) again = setTimeout(refresh, page.again);
  for (const button of main.querySelectorAll("[data-show-all]")) {
    button.addEventListener("click", () => {
      showAll.add(location.pathname);
      show({ keepScroll: true });
    });
  }
  if (keepScroll) window.scrollTo(0, scroll);
  main.dataset.shown = String(Date.now());
  main.dataset.renderMs = String(Math.round(performance.now() - started));
  // When the page as shown was painted, from the navigation's start (what a person waits).
  requestAnimationFrame(() => setTimeout(() => (main.dataset.paintedAt = String(Math.round(performance.now())))));
}

/** Shows the page again soon (changes come in bursts: one read for a burst). */
function refresh() {
  if (showing) return;
  showing = setTimeout(async () => {
    showing = null;
    await show({ keepScroll: true });
  }, 100);
}

async function act(question, call) {
  if (!confirm(question)) return;
  try {
    await call();
  } catch (err) {
    alert(err instanceof ApiError ? `${err.code}: ${err.message.replace(/`/g, "")}` : String(err));
  }
  refresh();
}

function login(message) {
  document.title = "Sign in · allot";
  main.innerHTML = h`<h1>Sign in</h1><form class="login" id="login">
      <p>This daemon asks who you are. Paste an API token (from <code>allot api-token create</code> or your administrator). It is kept for this browser tab only, never in a link.</p>
      <label for="token">API token</label><input id="token" type="password" autocomplete="off" required>
      ${message ? h`<p class="error">${message}</p>` : ""}<button type="submit">Sign in</button></form>`.text;
  document.getElementById("token").focus();
  document.getElementById("login").addEventListener("submit", async (event) => {
    event.preventDefault();
    sessionStorage.setItem(tokenKey, document.getElementById("token").value.trim());
    try {
      await whoami();
      startWatching();
      show();
    } catch (err) {
      sessionStorage.removeItem(tokenKey);
      login(err instanceof NeedsToken ? "That token is not known (or has expired)." : String(err));
    }
  });
}

async function whoami() {
  const me = await api("/v1/whoami");
  whoBadge.innerHTML = me.user ? h`${me.user} · <a href="#" id="sign-out">sign out</a>`.text : "";
  const out = document.getElementById("sign-out");
  if (out) {
    out.addEventListener("click", (event) => {
      event.preventDefault();
      sessionStorage.removeItem(tokenKey);
      location.reload();
    });
  }
}

// ---- live: the change feed, or polling where the caller may not watch everything ----

let watching = false;
// The stream ends when the page is left (a kept page must not hold a connection: a browser has
// but a few per server), and starts again when a kept page is shown again.
let leaving = new AbortController();
window.addEventListener("pagehide", () => {
  leaving.abort();
  watching = false;
});
window.addEventListener("pageshow", (event) => {
  if (event.persisted) {
    leaving = new AbortController();
    startWatching();
    refresh();
  }
});

function setLive(kind, words) {
  liveBadge.className = `live ${kind}`;
  liveBadge.textContent = words;
}

async function startWatching() {
  if (watching) return;
  watching = true;
  let failures = 0;
  for (;;) {
    try {
      if (leaving.signal.aborted) return;
      const response = await fetch("/v1/watch", {
        headers: { ...authHeaders(), Accept: "text/event-stream" },
        signal: leaving.signal,
      });
      if (response.status === 403) return poll();
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      if (failures > 0) refresh(); // what changed while away
      failures = 0;
      setLive("ok", "live");
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      const stream = new EventStream();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        for (const message of stream.feed(decoder.decode(value, { stream: true }))) {
          if (message.data) changed(JSON.parse(message.data).key);
        }
      }
      throw new Error("the stream ended");
    } catch (err) {
      if (leaving.signal.aborted) return;
      failures += 1;
      setLive("bad", "connection lost — retrying");
      await new Promise((resolve) => setTimeout(resolve, Math.min(250 * 2 ** failures, 5000)));
    }
  }
}

function changed(key) {
  if (current.watch.some((prefix) => key.startsWith(prefix))) refresh();
}

async function poll() {
  setLive("ok", "live (every 2 s)");
  for (;;) {
    await new Promise((resolve) => setTimeout(resolve, 2000));
    try {
      await fetch("/readyz");
      setLive("ok", "live (every 2 s)");
      refresh();
    } catch {
      setLive("bad", "connection lost — retrying");
    }
  }
}

// ---- links stay in the page ----

document.addEventListener("click", (event) => {
  const link = event.target.closest("a[href^='/ui']");
  if (!link || event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
  event.preventDefault();
  history.pushState(null, "", link.getAttribute("href"));
  show().then(() => main.focus());
});
window.addEventListener("popstate", () => show());

(async () => {
  try {
    await whoami();
  } catch (err) {
    if (err instanceof NeedsToken) return login();
  }
  startWatching();
  await show();
})();
