// The console's pages: overview, jobs, one job, dead letters. Each renders into `main` and stops its
// polling or stream when `signal` aborts (the user went to another page).
import { ApiError, badge, h, request, seconds, sse, when } from "./api.js";

const POLL_MS = 2000;
const STATUSES = ["queued", "running", "succeeded", "failed", "cancelled", "expired"];

function failure(error) {
  return h("p", { class: "error", "data-testid": "error" }, error.message);
}

// ---- overview --------------------------------------------------------------------------------
function card(label, value, testid) {
  return h("div", { class: "card" }, h("div", { class: "value", "data-testid": testid }, value),
    h("div", { class: "label" }, label));
}

function workerRow(w, now) {
  const kv = w.kv_blocks ? Math.round((100 * w.load.blocks_used) / w.kv_blocks) : 0;
  return h("tr", { "data-testid": "worker", "data-worker": w.id, "data-model": w.model },
    h("td", {}, w.id), h("td", {}, w.host), h("td", {}, w.model),
    h("td", {}, `${w.device} · ${w.dtype}`),
    h("td", {}, `${w.load.running} running, ${w.load.waiting} waiting / ${w.max_batch_size}`),
    h("td", {}, h("div", { class: "meter", title: `${w.load.blocks_used} of ${w.kv_blocks} blocks` },
      h("span", { style: { width: `${kv}%` } })), ` ${kv}%`),
    h("td", {}, w.jobs),
    h("td", {}, `${Math.max(0, now - w.heartbeat_at).toFixed(1)} s ago`),
    h("td", {}, w.draining ? badge("draining") : badge("live")));
}

// Each model's queue and live workers: shown when the service runs more than one model.
function modelTable(models) {
  return h("table", {}, h("thead", {}, h("tr", {}, ["model", "aliases", "live workers", "queued", "running"]
    .map((c) => h("th", {}, c)))),
  h("tbody", {}, models.map((m) => h("tr", { "data-testid": "model", "data-model": m.name },
    h("td", {}, m.name), h("td", {}, m.aliases.join(", ") || "—"),
    h("td", { class: m.workers ? null : "error" }, m.workers), h("td", {}, m.queued), h("td", {}, m.running)))));
}

function chart(minutes) {
  const most = Math.max(1, ...minutes.map((m) => Object.values(m.ended).reduce((a, b) => a + b, 0)));
  return h("div", { class: "chart", "data-testid": "chart" }, minutes.map((m) => {
    const bad = m.ended.failed + m.ended.expired;
    const label = `${new Date(m.start * 1000).toLocaleTimeString()}: ${m.ended.succeeded} succeeded, ` +
      `${m.ended.failed} failed, ${m.ended.cancelled} cancelled, ${m.ended.expired} expired, ${m.tokens} tokens`;
    return h("div", { class: "bar", title: label },
      h("span", { class: "ok", style: { height: `${(100 * (m.ended.succeeded + m.ended.cancelled)) / most}%` } }),
      h("span", { class: "bad", style: { height: `${(100 * bad) / most}%` } }));
  }));
}

export async function overview(main, { signal }) {
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  main.replaceChildren(h("h1", {}, "Overview"), body);
  while (!signal.aborted) {
    try {
      const o = await request("GET", "/v1/console/overview");
      const last = o.jobs.minutes[o.jobs.minutes.length - 1];
      const ended = o.jobs.minutes.reduce((sum, m) => {
        for (const [k, v] of Object.entries(m.ended)) sum[k] = (sum[k] || 0) + v;
        return sum;
      }, {});
      const tokens = o.jobs.minutes.reduce((a, m) => a + m.tokens, 0);
      body.replaceChildren(
        h("div", { class: "cards" },
          card("queued", o.queue ? o.queue.queued : "?", "queued"),
          card("running", o.queue ? o.queue.running : "?", "running"),
          card("live workers", o.workers.length, "workers"),
          card(`succeeded, last ${o.jobs.window_s / 60} min`, ended.succeeded || 0, "succeeded"),
          card(`failed or expired, last ${o.jobs.window_s / 60} min`, (ended.failed || 0) + (ended.expired || 0), "errors"),
          card("tokens / min (last minute)", last ? last.tokens : 0, "tokens-per-min"),
          o.dead_letters !== null && o.dead_letters !== undefined ? card("dead letters", o.dead_letters, "dead-letters") : null),
        ...(o.models.length > 1 ? [h("h2", {}, "Models"), modelTable(o.models)] : []),
        h("h2", {}, "Workers"),
        o.workers.length ? h("table", {}, h("thead", {}, h("tr", {}, ["id", "host", "model", "device", "batch",
          "KV cache", "jobs", "last seen", "state"].map((c) => h("th", {}, c)))),
        h("tbody", {}, o.workers.map((w) => workerRow(w, o.now))))
          : h("p", { class: "error", "data-testid": "no-workers" }, "No live worker: no heartbeat within the lease."),
        h("h2", {}, `Jobs ended per minute, last ${o.jobs.window_s / 60} minutes`),
        chart(o.jobs.minutes),
        h("p", { class: "muted" }, `${tokens} tokens generated in the window; counted from the records of the ` +
          `${o.jobs.sampled} newest jobs${o.jobs.truncated ? " (more were submitted: counts are partial)" : ""}. ` +
          `Refreshes every ${POLL_MS / 1000} s; updated `,
        h("span", { "data-testid": "updated" }, new Date(o.now * 1000).toLocaleTimeString()), "."),
      );
    } catch (error) {
      body.replaceChildren(failure(error));
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}

// ---- jobs ------------------------------------------------------------------------------------
const PAGE = 20;

// A page of the caller's jobs with this status (GET /v1/jobs has no filter: pages are read until
// PAGE match), and the cursor of the next page (null: none).
async function jobsPage(status, after) {
  const found = [];
  let cursor = after;
  for (let reads = 0; reads < 20; reads++) {
    const q = new URLSearchParams({ limit: "100" });
    if (cursor) q.set("after", cursor);
    const page = await request("GET", `/v1/jobs?${q}`);
    for (const job of page.data) {
      if (status && job.status !== status) continue;
      found.push(job);
      if (found.length === PAGE) return { jobs: found, next: job.id };
    }
    if (!page.has_more) return { jobs: found, next: null };
    cursor = page.last_id;
  }
  return { jobs: found, next: cursor };
}

function jobRow(job) {
  const r = job.result || {};
  return h("tr", { "data-testid": "job", "data-job": job.id },
    h("td", {}, h("a", { href: `#/jobs/${job.id}`, class: "mono" }, job.id)),
    h("td", {}, job.kind), h("td", {}, badge(job.status)), h("td", {}, when(job.created_at)),
    h("td", {}, r.usage ? r.usage.completion_tokens : "—"), h("td", {}, r.finish_reason || "—"),
    h("td", {}, seconds(r.timings ? r.timings.total_s : null)));
}

export async function jobs(main, { signal }) {
  const state = { status: "", cursors: [null] };
  const select = h("select", { "data-testid": "status-filter" }, h("option", { value: "" }, "all statuses"),
    STATUSES.map((s) => h("option", { value: s }, s)));
  const table = h("div", {});
  const prev = h("button", { type: "button" }, "← Newer");
  const next = h("button", { type: "button" }, "Older →");
  main.replaceChildren(h("h1", {}, "Jobs"),
    h("div", { class: "toolbar" }, h("label", {}, "Status ", select), prev, next,
      h("button", { type: "button", onclick: () => load() }, "Refresh")),
    table);
  let nextCursor = null;
  async function load() {
    try {
      const { jobs, next: cursor } = await jobsPage(state.status, state.cursors[state.cursors.length - 1]);
      if (signal.aborted) return;
      nextCursor = cursor;
      prev.disabled = state.cursors.length === 1;
      next.disabled = !cursor;
      table.replaceChildren(jobs.length ? h("table", {},
        h("thead", {}, h("tr", {}, ["id", "kind", "status", "created", "tokens", "finish", "total"].map((c) => h("th", {}, c)))),
        h("tbody", {}, jobs.map(jobRow)))
        : h("p", { class: "muted", "data-testid": "no-jobs" }, "No jobs" + (state.status ? ` ${state.status}` : "") + "."));
    } catch (error) {
      table.replaceChildren(failure(error));
    }
  }
  select.addEventListener("change", () => { state.status = select.value; state.cursors = [null]; load(); });
  prev.addEventListener("click", () => { state.cursors.pop(); load(); });
  next.addEventListener("click", () => { state.cursors.push(nextCursor); load(); });
  await load();
}

// ---- one job ---------------------------------------------------------------------------------
function fields(rows) {
  return h("dl", { class: "fields" }, rows.filter(Boolean).map(([k, v, testid]) =>
    [h("dt", {}, k), h("dd", testid ? { "data-testid": testid } : {}, v)]));
}

function record(job) {
  const r = job.result || {};
  const t = r.timings || {};
  const u = r.usage;
  return h("div", {},
    fields([
      ["status", badge(job.status), "job-status"], ["kind", job.kind], ["priority", job.priority],
      ["created", when(job.created_at)], ["started", when(job.started_at)],
      ["first token", when(job.first_token_at)], ["finished", when(job.finished_at)],
      ["deadline", when(job.deadline)],
      ["queue / TTFT / total", `${seconds(t.queue_s)} / ${seconds(t.ttft_s)} / ${seconds(t.total_s)}`],
      ["usage", u ? `${u.prompt_tokens} prompt + ${u.completion_tokens} completion (${u.cached_tokens} cached)` : "—"],
      ["finish reason", r.finish_reason || "—", "finish-reason"], ["seed", r.seed ?? "—"],
      r.error ? ["error", r.error] : null,
      job.cancel_requested ? ["cancel", "requested"] : null,
    ]),
    h("h2", {}, "Webhooks"),
    job.webhook_deliveries.length ? h("table", {}, h("thead", {}, h("tr", {},
      ["event", "url", "state", "attempts"].map((c) => h("th", {}, c)))),
    h("tbody", {}, job.webhook_deliveries.map((d) => h("tr", {}, h("td", {}, d.event), h("td", {}, d.url),
      h("td", {}, badge(d.state)), h("td", {}, d.attempts.map((a) =>
        h("div", {}, `#${a.attempt} ${when(a.at)}: ${a.status_code ?? a.error ?? "—"} (${a.duration_s.toFixed(2)} s)`)))))))
      : h("p", { class: "muted" }, job.webhook ? "No delivery yet." : "No webhook."));
}

export async function job(main, { signal, id }) {
  const info = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  const tokens = h("pre", { class: "tokens", "data-testid": "tokens" });
  const count = h("span", { "data-testid": "token-count" }, "0");
  const streamState = h("span", { class: "muted", "data-testid": "stream-state" }, "connecting");
  const cancel = h("button", { type: "button", class: "danger", "data-testid": "cancel" }, "Cancel job");
  main.replaceChildren(h("h1", {}, "Job ", h("span", { class: "mono" }, id)),
    h("div", { class: "toolbar" }, cancel, h("a", { href: "#/jobs" }, "← all jobs")), info,
    h("h2", {}, "Tokens (", count, ") ", streamState), tokens);
  async function refresh() {
    try {
      const view = await request("GET", `/v1/jobs/${encodeURIComponent(id)}`);
      info.replaceChildren(record(view));
      cancel.disabled = !["queued", "running"].includes(view.status);
      return view;
    } catch (error) {
      info.replaceChildren(failure(error));
      cancel.disabled = true;
      return null;
    }
  }
  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    try { await request("DELETE", `/v1/jobs/${encodeURIComponent(id)}`); } catch (error) { info.prepend(failure(error)); }
    await refresh();
  });
  if (!(await refresh())) { streamState.textContent = ""; return; }
  let n = 0;
  const controller = new AbortController();
  signal.addEventListener("abort", () => controller.abort());
  try {
    for await (const event of sse(`/v1/jobs/${encodeURIComponent(id)}/events`, { signal: controller.signal })) {
      if (event.event === "error") { streamState.textContent = JSON.parse(event.data).error.message; break; }
      const data = JSON.parse(event.data);
      streamState.textContent = "streaming";
      if (data.token && !data.token.special) tokens.append(data.token.text);
      if (data.token) count.textContent = String(++n);
      if (n === 1 && data.token) refresh();
      if (data.final) { streamState.textContent = "ended"; break; }
    }
  } catch (error) {
    if (!signal.aborted) streamState.textContent = error instanceof ApiError ? error.message : "stream lost";
  }
  if (!signal.aborted) await refresh();
}

// ---- dead letters ----------------------------------------------------------------------------
function short(id) {
  return id ? `${id.slice(0, 10)}…` : "—";
}

export async function deadLetters(main, { signal, whoami }) {
  const body = h("div", {});
  const notice = h("div", {});
  main.replaceChildren(h("h1", {}, "Dead letters"), notice, body);
  async function load() {
    try {
      const list = await request("GET", "/v1/admin/dead-letters?limit=100");
      if (signal.aborted) return;
      body.replaceChildren(h("p", { class: "muted" }, `${list.total} ${list.total === 1 ? "entry" : "entries"} in the dead-letter stream` +
        (list.has_more ? " (the newest 100 shown)" : "") + ". Requeue runs a job again from the start with " +
        "a whole max_attempts budget; delete drops the entry."),
      list.data.length ? h("table", {}, h("thead", {}, h("tr", {}, ["entry", "job", "tenant", "kind", "reason",
        "deliveries", "worker", "when", "job now", ""].map((c) => h("th", {}, c)))),
      h("tbody", {}, list.data.map((d) => h("tr", { "data-testid": "dead-letter", "data-entry": d.id, "data-job": d.job_id },
        h("td", { class: "mono nowrap" }, d.id),
        h("td", { class: "mono nowrap", title: d.job_id }, d.job_id && d.tenant === whoami.tenant
          ? h("a", { href: `#/jobs/${d.job_id}` }, short(d.job_id)) : short(d.job_id)),
        h("td", {}, d.tenant || "—"), h("td", {}, d.kind || "—"), h("td", { class: "reason" }, d.reason),
        h("td", {}, d.deliveries ?? "—"), h("td", {}, d.worker || "—"), h("td", {}, when(d.at)),
        h("td", {}, d.job_status ? badge(d.job_status) : "expired"),
        h("td", { class: "actions" },
          h("button", { type: "button", "data-testid": "requeue", disabled: !d.requeueable, onclick: () => act("POST", d, "requeue") }, "Requeue"),
          h("button", { type: "button", class: "danger", "data-testid": "delete", onclick: () => act("DELETE", d) }, "Delete"))))))
        : h("p", { class: "muted", "data-testid": "no-dead-letters" }, "The dead-letter stream is empty."));
    } catch (error) {
      body.replaceChildren();
      notice.replaceChildren(h("div", { class: "forbidden", "data-testid": "forbidden" },
        h("strong", {}, error.status === 403 ? "Operators only. " : "Could not list the dead letters. "), error.message));
    }
  }
  async function act(method, entry, verb) {
    if (method === "DELETE" && !window.confirm(`Delete dead-letter entry ${entry.id} (job ${entry.job_id})?`)) return;
    const path = `/v1/admin/dead-letters/${encodeURIComponent(entry.id)}${verb ? `/${verb}` : ""}`;
    try {
      const answer = await request(method, path);
      notice.replaceChildren(h("p", { class: "ok", "data-testid": "notice" }, method === "DELETE"
        ? `Deleted entry ${entry.id}.` : `Requeued job ${answer.id}: it is ${answer.status}.`));
    } catch (error) {
      notice.replaceChildren(failure(error));
    }
    await load();
  }
  await load();
}
