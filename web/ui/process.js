// The process page (`/process/PID?...`): threads, their states over time,
// flame graphs of every kind, runqueue latency, what is blocked now and
// exports. Everything it shows is in its URL, so a pasted link opens the
// same view. Each panel loads and fails on its own.
"use strict";

WS.ready.then(() => {
  const { el } = WS;
  const pid = (location.pathname.match(/^\/process\/(\d+)/) || [])[1];
  /** The kinds the API takes, the default ("wall") first. */
  const KINDS = [...WS.KINDS].sort((a, b) => (b === "wall") - (a === "wall"));
  const GROUPS = WS.GROUPS;
  /** Rows drawn at first (a 10,000-row table takes seconds to lay out);
   * "show all" draws the rest on demand. */
  const FIRST_TABLE_ROWS = 200;
  let tableRows = FIRST_TABLE_ROWS;
  const tooltip = document.getElementById("tooltip");
  const v0 = WS.view();

  // ---- controls ----
  const tgroup = el("select", { id: "thread-group" },
    el("option", { value: "thread", textContent: "by thread" }), el("option", { value: "pool", textContent: "by pool" }));
  tgroup.value = v0.get("tgroup") === "pool" ? "pool" : "thread";
  const kind = el("select", { id: "kind" });
  for (const k of KINDS) kind.append(el("option", { value: k, textContent: k }));
  kind.value = KINDS.includes(v0.get("kind")) ? v0.get("kind") : "wall";
  const group = el("select", { id: "group" });
  for (const g of GROUPS) group.append(el("option", { value: g, textContent: `per ${g}` }));
  /** Threads past which the flame graph defaults to one tower per pool. */
  const MANY_THREADS = 64;
  let groupAsked = GROUPS.includes(v0.get("group"));
  group.value = groupAsked ? v0.get("group") : "thread";
  const search = el("input", { type: "search", id: "flame-search", placeholder: "search frames", value: v0.get("search") || "" });
  const diff = el("input", { type: "checkbox", id: "flame-diff" });
  diff.checked = v0.get("diff") === "1";

  // ---- exact timeline: /trace, downloaded as a file ----
  const traceButton = document.getElementById("trace-record");
  const traceStatus = document.getElementById("trace-status");
  traceButton.addEventListener("click", async () => {
    traceButton.disabled = true;
    traceStatus.className = "muted";
    traceStatus.textContent = "recording…";
    try {
      const r = await fetch(`/trace?pid=${pid}&seconds=5`);
      if (!r.ok) {
        const body = await r.json().catch(() => ({}));
        throw new Error(body.error || `HTTP ${r.status}`);
      }
      const blob = await r.blob();
      const name = ((r.headers.get("content-disposition") || "").match(/filename=([^;]+)/) || [])[1]
        || `wallscope-${pid}.perfetto-trace`;
      const a = el("a", { href: URL.createObjectURL(blob), download: name });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(a.href), 60000);
      traceStatus.textContent = `downloaded ${name} (${Math.round(blob.size / 1024)} KiB)`;
    } catch (e) {
      traceStatus.className = "error";
      traceStatus.textContent = `trace failed: ${e.message}`;
    } finally {
      traceButton.disabled = false;
    }
  });

  const win = () => WS.windowQuery();
  const tableState = { key: v0.get("tsort") || "wall_us" };
  let threadReport = null;

  // ---- summary ----
  async function summary() {
    await WS.panel("summary", async () => {
      threadReport = await WS.getJSON(`/threads?${WS.query({ pid, ...win() })}`);
      const r = threadReport;
      document.getElementById("title").textContent = `${r.comm || "?"} (${pid})`;
      document.title = `wallscope: ${r.comm || pid}`;
      const all = r.threads.length + (r.folded || []).reduce((n, f) => n + f.threads, 0);
      const parts = [`${all} threads`, WS.describeWindow()];
      if (r.recorded_seconds < r.seconds) parts.push(`only ${r.recorded_seconds} s recorded`);
      const resolution = WS.resolutionNote(r.resolution);
      if (resolution) parts.push(resolution);
      if (r.container) parts.push(`container ${[r.container.namespace, r.container.pod, r.container.container].filter(Boolean).join("/") || r.container.id.slice(0, 12)}`);
      if (r.jvm) parts.push(`JVM (${r.jvm.attach || "?"})`);
      if (r.note) parts.push(r.note);
      const body = document.getElementById("summary-body");
      body.replaceChildren(parts.join(" · "), " ", WS.stateBar(r.process));
    });
  }

  // ---- thread table ----
  function drawThreads() {
    const r = threadReport;
    const table = document.getElementById("threads-table");
    table.replaceChildren();
    const byPool = tgroup.value === "pool";
    // Per thread: its median blocked interval and who ended most of them.
    const blocked = (t) => (t.sleeps ? t.sleeps.median_us : -1);
    const wokenBy = (t) => (t.sleeps && t.sleeps.woken_by.length
      ? t.sleeps.woken_by.map((w) => `${w.by} ${Math.round(100 * w.share)}%`).join(", ") : "");
    // Short-lived threads of a pool come folded: one row each pool.
    const folded = (r.folded || []).map((f) => ({ ...f, name: `${f.pool} ×${f.threads}`, tid: "" }));
    const rows = (byPool ? r.pools : [...r.threads, ...folded]).map((t) => ({
      ...t, dominant: WS.dominant(t), blocked_median: blocked(t), woken_by: wokenBy(t),
    }));
    const columns = [
      byPool ? { key: "pool", label: "pool" } : { key: "name", label: "thread" },
      byPool ? { key: "threads", label: "threads", num: true } : { key: "tid", label: "tid", num: true },
      { key: "wall_us", label: "wall ms", num: true },
      ...WS.STATES.map((s) => ({ key: `${s}_us`, label: `${s} ms`, num: true })),
      { key: "switches", label: "switches", num: true },
      { key: "wakeups_received", label: "wakeups", num: true },
      { key: "dominant", label: "mostly" },
      { key: "bar", label: "time by state" },
      ...(byPool ? [] : [
        { key: "blocked_median", label: "median block ms", num: true },
        { key: "woken_by", label: "woken by (share of blocked time)" },
      ]),
    ];
    const key = columns.some((c) => c.key === tableState.key) && tableState.key !== "bar" ? tableState.key : "wall_us";
    const num = columns.find((c) => c.key === key).num;
    rows.sort((a, b) => (num ? b[key] - a[key] : String(a[key]).localeCompare(String(b[key]))));
    WS.sortable(table, columns, { get key() { return key; }, set key(k) { tableState.key = k; WS.setView({ tsort: k }); } }, drawThreads);
    const body = el("tbody");
    for (const t of rows.slice(0, tableRows)) {
      const tr = el("tr", { "data-dominant": t.dominant });
      if (!byPool) Object.assign(tr.dataset, t.tid === "" ? { folded: t.threads } : { tid: t.tid, wokenBy: t.woken_by });
      for (const c of columns) {
        if (c.key === "bar") tr.append(el("td", {}, WS.stateBar(t)));
        else if (c.key === "blocked_median") {
          tr.append(el("td", { className: "num", textContent: t.sleeps ? WS.ms(t.blocked_median) : "",
            title: t.sleeps ? `${t.sleeps.intervals} blocked intervals, p90 ${WS.ms(t.sleeps.p90_us)} ms` : "" }));
        }
        else if (c.key.endsWith("_us")) tr.append(el("td", { className: "num", textContent: WS.ms(t[c.key]) }));
        else tr.append(el("td", { className: c.num ? "num" : "", textContent: t[c.key] }));
      }
      body.append(tr);
    }
    table.append(body);
    const status = document.getElementById("threads-status");
    status.textContent = `${rows.length} ${byPool ? "pools" : "threads"}`;
    if (rows.length > tableRows) {
      const all = el("button", { id: "threads-all", textContent: `show all (${tableRows} first shown)` });
      all.addEventListener("click", () => { tableRows = Infinity; drawThreads(); });
      status.append(" ", all);
    }
  }

  async function threads() {
    await WS.panel("threads", async () => {
      if (!threadReport) throw new Error("no thread report (see above)");
      drawThreads();
    });
  }

  // ---- slowest spans: /spans, sorted by the server ----
  /** What `/spans` sorts by: wall time, or any state's (meta.json's). */
  const SPAN_COLUMNS = ["wall", ...WS.STATES];
  /** The span whose threads the timeline outlines. */
  let highlight = null;

  async function spans() {
    await WS.panel("spans", async (panel) => {
      const sort = SPAN_COLUMNS.includes(WS.view().get("ssort")) ? WS.view().get("ssort") : "wall";
      const r = await WS.getJSON(`/spans?${WS.query({ pid, sort, limit: 50, ...win() })}`);
      const table = document.getElementById("spans-table");
      table.replaceChildren();
      const columns = [{ key: "span", label: "span" }, ...SPAN_COLUMNS.map((k) => ({ key: k, label: `${k} ms`, num: true })),
        { key: "threads", label: "threads" }, { key: "stack", label: "top stack" }];
      const state = { get key() { return sort; }, set key(k) { if (SPAN_COLUMNS.includes(k)) WS.setView({ ssort: k }); } };
      WS.sortable(table, columns, state, spans);
      const body = el("tbody");
      const chosen = WS.view().get("span");
      for (const s of r.spans) {
        const attrs = Object.entries(s.attrs).map(([k, v]) => `${k}=${v}`).join(" ");
        const name = el("a", { href: "#", textContent: `${s.span_id}${attrs ? ` ${attrs}` : ""}`, title: `trace ${s.trace_id || "unknown"}` });
        name.addEventListener("click", (ev) => { ev.preventDefault(); WS.setView({ span: s.span_id }); choose(s); timeline(); });
        if (s.span_id === chosen) choose(s);
        const ms = (us) => el("td", { className: "num", textContent: WS.ms(us) });
        const top = s.top_stacks[0];
        body.append(el("tr", { className: s.span_id === chosen ? "highlight" : "" }, el("td", {}, name), ms(s.wall_us),
          ...SPAN_COLUMNS.slice(1).map((k) => ms(s.states_us[k])),
          el("td", { textContent: s.threads.join(" ") }),
          el("td", { className: "muted", textContent: top ? `${top.state}: ${top.stack.split(";").slice(-3).join(";")}` : "" })));
      }
      table.append(body);
      panel.dataset.spans = r.spans_total;
      const dropped = r.dropped.aggregated_spans + r.dropped.refused_rows;
      document.getElementById("spans-status").textContent = r.spans_total
        ? `${r.spans.length} of ${r.spans_total} spans, most ${sort} time first${r.aggregated.length ? `; older spans kept by attributes only (${dropped} dropped or folded)` : ""}; click one to outline its threads on the timeline`
        : "no OpenTelemetry span seen in this window (the process publishes no thread context)";
    });
  }

  /** Outlines span `s`'s threads over its time on the timeline. */
  function choose(s) {
    highlight = { tids: new Set(s.threads), from_ms: s.first_seen * 1000, until_ms: s.last_seen * 1000 };
  }

  // ---- timeline ----
  async function timeline() {
    await WS.panel("timeline", async (panel) => {
      const data = await WS.getJSON(`/timeline?${WS.query({ pid, group: tgroup.value, ...win() })}`);
      Timeline.draw(document.getElementById("timeline-canvas"), document.getElementById("timeline-labels"), data, {
        tooltip,
        highlight,
        onRange: (from, until) => {
          const v = WS.view();
          WS.setView({ from, until, seconds: null, back: v.get("back") || v.get("seconds") || "30" });
          loadAll();
        },
      });
      panel.dataset.rows = data.rows.length;
      panel.dataset.columns = data.columns.length;
      const reset = document.getElementById("timeline-reset");
      reset.hidden = !WS.view().get("back");
      const notes = [];
      if (data.rows_left_out) notes.push(`${data.rows_left_out} more ${data.group}s (${WS.ms(data.left_out_wall_ms * 1000)} ms of wall time) not drawn: group by pool to see them all`);
      if (!data.rows.length) notes.push("nothing recorded in this window");
      document.getElementById("timeline-note").textContent = notes.join("; ");
    });
  }

  document.getElementById("timeline-reset").addEventListener("click", () => {
    const back = WS.view().get("back") || "30";
    WS.setView({ seconds: back, from: null, until: null, back: null });
    loadAll();
  });

  // ---- flame graph ----
  /** The window just before the current one, as long, for a diff. */
  function earlierWindow() {
    const w = win();
    const until = w.until ? Number(w.until) : Math.floor(Date.now() / 1000);
    const len = w.until ? Number(w.until) - Number(w.from) : Number(w.seconds);
    const from = w.until ? Number(w.from) : until - len;
    return { from: from - len, until: from };
  }

  async function flame() {
    await WS.panel("flame", async (panel) => {
      const q = { pid, kind: kind.value, group: group.value };
      const status = document.getElementById("flame-status");
      let text;
      try {
        text = await WS.getText(`/folded?${WS.query({ ...q, ...win() })}`);
      } catch (e) {
        if (e.status !== 404) throw e;
        text = "";
      }
      let before = null;
      if (diff.checked) {
        try { before = await WS.getText(`/folded?${WS.query({ ...q, ...earlierWindow() })}`); } catch (e) { before = ""; }
      }
      const info = Flame.draw(document.getElementById("flame-canvas"), text, { search: search.value, before, tooltip });
      panel.dataset.kind = kind.value;
      panel.dataset.total = info.total;
      panel.dataset.frames = info.frames;
      panel.dataset.matched = info.matched;
      const parts = [`${kind.value}, ${WS.describeWindow()}: ${WS.ms(info.total)} ms in ${info.frames} frames`];
      if (!info.total) parts.push(`no ${kind.value} samples in this window`);
      if (search.value) parts.push(`“${search.value}”: ${WS.ms(info.matched)} ms, ${WS.pct(info.matched, info.total)}%`);
      if (diff.checked) parts.push("red: more than in the window before, blue: less");
      status.textContent = parts.join(" · ");
      functionsTable(text);
    });
  }

  function functionsTable(text) {
    const { all, rows } = Flame.functions(text);
    const table = document.getElementById("flame-functions");
    table.replaceChildren();
    const state = { key: WS.view().get("fsort") === "self" ? "self" : "total" };
    rows.sort((a, b) => b[state.key] - a[state.key]);
    WS.sortable(table, [{ key: "name", label: "function" }, { key: "self", label: "self ms", num: true },
      { key: "total", label: "total ms", num: true }],
    { get key() { return state.key; }, set key(k) { if (k !== "name") { WS.setView({ fsort: k }); functionsTable(text); } } }, () => {});
    const body = el("tbody");
    for (const f of rows.slice(0, 200)) {
      const name = el("a", { href: "#", textContent: f.name });
      name.addEventListener("click", (ev) => { ev.preventDefault(); search.value = f.name; WS.setView({ search: f.name }); flame(); });
      body.append(el("tr", {}, el("td", {}, name),
        el("td", { className: "num", textContent: `${WS.ms(f.self)} (${WS.pct(f.self, all)}%)` }),
        el("td", { className: "num", textContent: `${WS.ms(f.total)} (${WS.pct(f.total, all)}%)` })));
    }
    table.append(body);
  }

  // ---- runqueue ----
  async function runqueue() {
    await WS.panel("runqueue", async (panel) => {
      const figures = document.getElementById("runqueue-figures");
      const hist = document.getElementById("runqueue-hist");
      let r;
      try {
        r = await WS.getJSON(`/runqueue?${WS.query({ pid, ...win() })}`);
      } catch (e) {
        if (e.status !== 404) throw e;
        figures.textContent = "no runqueue waits recorded in this window";
        hist.replaceChildren();
        panel.dataset.count = 0;
        return;
      }
      const us = (x) => (x >= 1000 ? `${(x / 1000).toFixed(1)} ms` : `${Math.round(x)} µs`);
      figures.textContent = `${r.count} waits, ${WS.ms(r.total_us)} ms · p50 ${us(r.p50_us)} · p90 ${us(r.p90_us)} · p99 ${us(r.p99_us)}`;
      panel.dataset.count = r.count;
      const max = Math.max(1, ...r.buckets.map((b) => b.count));
      const bars = el("div", { className: "hist" });
      const axis = el("div", { className: "hist-axis" });
      for (const b of r.buckets) {
        const bar = el("div", { title: `${us(b.from_us)} – ${us(b.to_us)}: ${b.count}` });
        bar.style.height = `${(100 * b.count) / max}%`;
        bars.append(bar);
        axis.append(el("span", { textContent: us(b.from_us) }));
      }
      hist.replaceChildren(bars, axis);
    });
  }

  // ---- blocked now ----
  async function blocked() {
    await WS.panel("blocked", async () => {
      const r = await WS.getJSON(`/blocked?${WS.query({ pid, limit: 50 })}`);
      const list = document.getElementById("blocked-list");
      list.replaceChildren();
      for (const t of r.threads) {
        const waker = t.woken_by && t.woken_by.kind === "thread" ? ` · last woken by ${t.woken_by.name || ""} (${t.woken_by.tid})` : "";
        const d = el("details", { className: "blocked" },
          el("summary", { textContent: `${t.name} (${t.tid}) · ${t.state} for ${t.in_state_s.toFixed(1)} s${t.syscall ? ` in ${t.syscall}` : ""}${waker}` }),
          el("pre", { textContent: t.stack.join("\n") || "(no stack)" }));
        list.append(d);
      }
      document.getElementById("blocked-status").textContent = r.threads.length
        ? `${r.matched} threads off-CPU for ${r.min_seconds} s or more, longest first${r.as_of ? `, as of ${new Date(r.as_of).toLocaleTimeString()}` : ""}`
        : "no thread of this process is blocked right now";
    });
  }

  // ---- export ----
  async function exportLinks() {
    await WS.panel("export", async () => {
      const q = WS.query({ pid, kind: kind.value, group: group.value, ...win() });
      const box = document.getElementById("export-links");
      box.replaceChildren(
        el("a", { href: `/folded?${q}`, textContent: "folded", download: `wallscope-${pid}-${kind.value}.folded` }), " · ",
        el("a", { href: `/flamegraph?${q}`, textContent: "SVG" }), " · ",
        el("a", { href: `/pprof?${q}`, textContent: "pprof (.pb.gz)" }), " · ",
        el("a", { href: `/threads?${WS.query({ pid, ...win(), format: "text" })}`, textContent: "threads (text)" }),
        el("p", { className: "note", textContent: "speedscope opens both the folded file and the pprof file: drop either onto speedscope (the Firefox Profiler and Pyroscope take the pprof file)." }));
    });
  }

  async function loadAll() {
    threadReport = null;
    await summary();
    // One tower per thread of thousands of threads is megabytes of stacks
    // nobody can read: unless the address says otherwise, pools then.
    if (!groupAsked && threadReport) {
      const n = threadReport.threads.length + (threadReport.folded || []).reduce((a, f) => a + f.threads, 0);
      group.value = n > MANY_THREADS ? "pool" : "thread";
    }
    // The spans first: the timeline outlines the one chosen.
    await spans();
    await Promise.all([threads(), timeline(), flame(), runqueue(), blocked(), exportLinks()]);
    // For tests and the benchmark: when, and how long after navigation.
    document.body.dataset.loadedMs = String(Math.round(performance.now()));
    document.body.dataset.loaded = String(Date.now());
  }

  tgroup.addEventListener("change", () => { WS.setView({ tgroup: tgroup.value }); threads(); timeline(); });
  kind.addEventListener("change", () => { WS.setView({ kind: kind.value }); flame(); exportLinks(); });
  group.addEventListener("change", () => { groupAsked = true; WS.setView({ group: group.value }); flame(); exportLinks(); });
  let typing = null;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { WS.setView({ search: search.value }); flame(); }, 200);
  });
  diff.addEventListener("change", () => { WS.setView({ diff: diff.checked ? "1" : null }); flame(); });

  document.getElementById("controls").append(WS.windowPicker(loadAll), WS.autoRefresh(loadAll, 10000));
  document.getElementById("threads-controls").append(tgroup);
  document.getElementById("timeline-legend").append(WS.legend());
  document.getElementById("flame-controls").append(kind, group, search, el("label", {}, diff, " diff with the window before"));
  if (!pid) {
    document.getElementById("summary-body").textContent = "no pid in this address: use /process/PID";
  } else {
    loadAll();
  }
});
