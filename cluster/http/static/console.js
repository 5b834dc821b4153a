// sdv-fanout console: polls the controller's JSON API and redraws in place (no framework, no build step).
// Everything shown comes from /api/status and /api/requests...; text goes through textContent only, so
// ids chosen by clients (request ids, VINs) cannot inject markup.
"use strict";

const POLL_MS = 1000;
const watched = new Map(); // request id -> <tr>
// true once GET /api/requests answers 200; false on 501 (a cluster view without the request lifecycle, see
// cluster/http/views.py: then requests are watched by id); null before the first try
let lifecycle = null;

const $ = (id) => document.getElementById(id);
const fmt = (n) => (n === undefined || n === null ? "-" : Number(n).toLocaleString("en-US"));

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    if (c instanceof Node) {
      const td = document.createElement("td");
      if (c.classList && c.classList.contains("num")) td.className = "num";
      td.appendChild(c);
      tr.appendChild(td);
    } else {
      tr.appendChild(typeof c === "number" ? el("td", fmt(c), "num") : el("td", c));
    }
  }
  return tr;
}

async function getJSON(path, options) {
  const res = await fetch(path, Object.assign({ cache: "no-store", credentials: "same-origin" }, options || {}));
  let body = null;
  try { body = await res.json(); } catch (e) { body = null; }
  return { status: res.status, body };
}

function setTotals(t) {
  $("total-nodes").textContent = fmt(t.nodes);
  $("total-shards").textContent = fmt(t.shards);
  $("total-connections").textContent = fmt(t.connections);
  $("total-vehicles").textContent = fmt(t.vehicles_connected);
  $("total-pending").textContent = fmt(t.pending_rows);
  $("total-inflight").textContent = fmt(t.in_flight);
  $("total-delivered").textContent = fmt(t.delivered);
  $("total-blobs").textContent = fmt(t.data_blobs);
}

function stateCell(alive) {
  return el("span", alive ? "up" : "down", alive ? "state-ok" : "state-bad");
}

// The direct channel of a node or shard (docs/architecture.md, "Direct channels"): calls it served, and calls of
// its own that fell back to Ray (a broken or refused channel; non-zero is worth a look at its log).
function channelCells(st) {
  if (!st.alive || st.channel === undefined) return ["-", "-"];
  if (st.channel === null) return [el("span", "off", "muted"), el("span", "-", "muted")];
  const fallbacks = st.channel_fallbacks || 0;
  return [st.channel.requests || 0, fallbacks ? el("span", fmt(fallbacks), "num lag-n") : 0];
}

function setNodes(nodes) {
  const body = $("nodes").tBodies[0];
  body.replaceChildren(...nodes.map((n) => row([
    n.node_id, n.url || `${n.host}:${n.port}`, stateCell(n.alive), n.connections, n.sessions, n.acks,
    n.triggers, n.rejected, n.auth_failures, ...channelCells(n),
  ])));
}

function replicasCell(rep) {
  const span = el("span");
  if (!rep || !rep.replicas.length) {
    span.textContent = "none";
    span.className = "muted";
    return span;
  }
  for (const r of rep.replicas) {
    const lag = r.lag === null || r.lag === undefined ? "?" : r.lag;
    const item = el("span", `${r.id}@${r.node || "?"} lag ${lag}${r.in_sync ? " (in sync)" : ""}`,
      "replica " + (lag === 0 ? "lag-0" : "lag-n"));
    span.appendChild(item);
  }
  return span;
}

function setShards(shards, replication) {
  const byShard = new Map(replication.map((r) => [r.shard, r]));
  const body = $("shards").tBodies[0];
  body.replaceChildren(...shards.map((s) => {
    const rep = byShard.get(s.shard);
    const primary = rep && rep.primary ? rep.primary.node || "?" : "?";
    return row([
      String(s.shard), primary, stateCell(s.alive && !(rep && rep.failing_over)), rep ? rep.epoch : null,
      rep ? rep.applied_seq : s.applied_seq, s.pending_rows, s.in_flight, s.delivered, ...channelCells(s),
      replicasCell(rep),
    ]);
  }));
}

function setHealth(st) {
  const badge = $("health");
  const down = st.nodes.filter((n) => !n.alive).length + st.shards.filter((s) => !s.alive).length;
  const lagging = st.replication.some((r) => r.failing_over || r.replicas.some((x) => x.lag !== 0));
  badge.textContent = down ? `${down} down` : lagging ? "replicas behind" : "healthy";
  badge.className = "badge " + (down ? "bad" : lagging ? "warn" : "ok");
}

function requestRow(id) {
  let tr = watched.get(id);
  if (tr) return tr;
  tr = document.createElement("tr");
  tr.dataset.requestId = id;
  const progress = document.createElement("progress");
  progress.max = 1;
  progress.value = 0;
  const cancel = el("button", "cancel", "secondary");
  cancel.type = "button";
  cancel.addEventListener("click", () => cancelRequest(id));
  const unwatch = el("button", "unwatch", "secondary");
  unwatch.type = "button";
  unwatch.addEventListener("click", () => { watched.delete(id); tr.remove(); });
  const actions = el("span");
  actions.append(cancel, " ", unwatch);
  tr.append(el("td", id), el("td"), el("td", "-", "num"), el("td", "-", "num"), el("td", "-", "num"),
    el("td", "-", "num"), el("td", "-", "num"), el("td", "-", "num"), el("td", "-"), el("td"));
  tr.cells[1].appendChild(progress);
  tr.cells[9].appendChild(actions);
  watched.set(id, tr);
  $("requests").tBodies[0].appendChild(tr);
  return tr;
}

function showRequest(id, r) {
  const tr = requestRow(id);
  const [, progCell, deliveredCell, pendingCell, vinsCell, inflightCell, expiredCell, cancelledCell, stateCell,
    actionsCell] = tr.cells;
  const progress = progCell.firstChild;
  if (!r) {
    for (const cell of [deliveredCell, pendingCell, vinsCell, inflightCell, expiredCell, cancelledCell, stateCell]) {
      cell.textContent = "-";
    }
    progress.removeAttribute("value");
    return;
  }
  // counters the lifecycle keeps (absent from the fallback answer built from reqs rows)
  inflightCell.textContent = r.inflight === undefined ? "-" : fmt(r.inflight);
  expiredCell.textContent = r.expired === undefined ? "-" : fmt(r.expired);
  cancelledCell.textContent = r.cancelled === undefined ? "-" : fmt(r.cancelled);
  stateCell.textContent = r.state || "-";
  tr.dataset.state = r.state || "";
  actionsCell.querySelector("button").disabled = r.state !== undefined && r.state !== "active";
  const atLeast = r.truncated ? "\u2265 " : "";
  progress.max = Math.max(1, r.vins);
  progress.value = r.delivered;
  progress.title = `${r.delivered} of ${r.vins} delivered`;
  deliveredCell.textContent = atLeast + fmt(r.delivered);
  pendingCell.textContent = atLeast + fmt(r.pending);
  vinsCell.textContent = atLeast + fmt(r.vins);
}

// bumped by an action on a request: a poll's answer read before the action is stale and must not undo
// what the action's own answer showed (a cancelled request flipping back to "active" for a second)
let requestsEpoch = 0;

async function refreshRequests() {
  const listed = new Set();
  const epoch = requestsEpoch;
  if (lifecycle !== false) {
    const list = await getJSON("/api/requests?limit=100");
    if (epoch !== requestsEpoch) return;
    if (list.status === 200) {
      lifecycle = true;
      for (const r of list.body.requests) {
        showRequest(r.request_id, r);
        listed.add(r.request_id);
      }
      $("requests-note").textContent = list.body.requests.length
        ? "Every request known to the cluster (the first 100 by id), live."
        : "No request yet.";
    } else if (list.status === 501) {
      lifecycle = false;
      $("requests-note").textContent = (list.body && list.body.error ? list.body.error + ". " : "") +
        "Watch a request by id to follow its progress.";
    }
  }
  for (const id of watched.keys()) {
    if (listed.has(id)) continue;
    const one = await getJSON("/api/requests/" + encodeURIComponent(id));
    if (epoch !== requestsEpoch) return;
    showRequest(id, one.status === 200 ? one.body : null);
  }
}

async function cancelRequest(id) {
  const res = await getJSON("/api/requests/" + encodeURIComponent(id) + "/cancel", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: "{}",
  });
  // its own line: a poll in flight would overwrite requests-note a moment later
  $("requests-action").textContent = res.status === 200
    ? `request ${id} cancelled`
    : `cancel ${id}: ${res.body && res.body.error ? res.body.error : "HTTP " + res.status}`;
  requestsEpoch += 1;  // a poll that started before this answer may have read the state before the cancel
  if (res.status === 200) showRequest(id, res.body);
}

async function poll() {
  try {
    const st = await getJSON("/api/status");
    if (st.status !== 200) throw new Error(st.body && st.body.error ? st.body.error : "HTTP " + st.status);
    setTotals(st.body.totals);
    setNodes(st.body.nodes);
    setShards(st.body.shards, st.body.replication);
    setHealth(st.body);
    await refreshRequests();
    $("updated").textContent = "updated " + new Date().toLocaleTimeString("en-GB");
    $("updated").className = "muted";
  } catch (err) {
    $("health").textContent = "unreachable";
    $("health").className = "badge bad";
    $("updated").textContent = String(err.message || err);
    $("updated").className = "error";
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

$("lookup").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const id = $("request-id").value.trim();
  if (id) {
    requestRow(id);
    $("request-id").value = "";
    refreshRequests();
  }
});

poll();
