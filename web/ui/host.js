// The host page: a summary line, then every process with its time split by
// state, busy and starved ones first, kernel threads folded into one row.
"use strict";

WS.ready.then(() => {
  const { el } = WS;
  /** Labels of the sort orders whose name is not the word shown. */
  const SORT_LABELS = { active: "active (not idle)", cpu: "CPU (sampled)", io: "I/O" };
  /** The order the page opens with: time not spent idle, so that busy and
   * starved processes come before idle ones with many threads. */
  const DEFAULT_SORT = "active";
  /** The orders the API takes, the default first. */
  const sorts = [...WS.SORTS].sort((a, b) => (b === DEFAULT_SORT) - (a === DEFAULT_SORT));
  /** Most rows drawn; the filter reaches the rest. */
  const MAX_ROWS = 500;
  /** The row kernel threads fold into. */
  const KERNEL_ROW = "[kernel threads]";
  /** `strip` letters (see the API's `/processes?strip=1`) by state. */
  const STRIP_STATES = WS.STRIP_LETTERS;
  let rows = [];
  /** Processes with threads held up now (from `/host`), by pid. */
  let stuck = new Map();
  let kernelOpen = false;

  const sortSel = el("select", { id: "sort" });
  for (const v of sorts) sortSel.append(el("option", { value: v, textContent: SORT_LABELS[v] || v }));
  sortSel.value = WS.view().get("sort") || DEFAULT_SORT;
  /** `/processes?group=` choices; "" lists processes one by one. */
  const GROUPS = { "": "nothing", comm: "name", parent: "parent", cgroup: "cgroup", container: "container" };
  const groupSel = el("select", { id: "group" });
  for (const [v, label] of Object.entries(GROUPS)) groupSel.append(el("option", { value: v, textContent: label }));
  groupSel.value = WS.view().get("group") || "";
  const search = el("input", {
    type: "search", id: "search", placeholder: "name, pid or container", value: WS.view().get("q") || "",
  });
  const kernelBox = el("input", { type: "checkbox", id: "kernel-threads" });
  kernelBox.checked = WS.view().get("kthreads") === "1";

  const containerText = (c) => (c ? [c.namespace, c.pod, c.container, c.id && c.id.slice(0, 12)].filter(Boolean).join("/") : "");
  const figure = (p, sort) => (sort === "cpu" ? p.cpu_us : p.time[`${sort}_us`]) || 0;

  /**
   * The figure columns: active, CPU, runqueue and wall time always, and
   * the sort's own figure when it is none of those, so no two are alike.
   */
  function figureColumns(sort) {
    const cols = [
      { key: "active", label: "active ms", get: (p) => p.time.active_us },
      { key: "runqueue", label: "runqueue ms", get: (p) => p.time.runqueue_us },
      { key: "exact-cpu", label: "CPU ms", get: (p) => p.time.cpu_us },
      { key: "wall", label: "wall ms", get: (p) => p.time.wall_us },
    ];
    if (!cols.some((c) => c.key === sort)) {
      const label = sort === "cpu" ? "sampled CPU ms" : `${SORT_LABELS[sort] || sort} ms`;
      cols.unshift({ key: sort, label, get: (p) => figure(p, sort) });
    }
    return cols;
  }

  function headRow(first, cols, sort) {
    const th = (text, cls = "") => el("th", { textContent: text, className: cls });
    return el("thead", {}, el("tr", {}, ...first.map(([t, c]) => th(t, c)),
      ...cols.map((c) => th(c.label, c.key === sort ? "num sorted" : "num")),
      th(`state over ${WS.describeWindow()} (oldest left)`), th("time by state (share of wall)"), th("mostly")));
  }

  /** A strip of the window's stretches, coloured as the process page's timeline. */
  function strip(letters) {
    const span = el("span", { className: "strip" });
    if (!letters) return span;
    const n = letters.length;
    const stops = [...letters].map((l, i) => {
      const colour = STRIP_STATES[l] ? `var(--${STRIP_STATES[l]})` : "transparent";
      return `${colour} ${(100 * i) / n}% ${(100 * (i + 1)) / n}%`;
    });
    span.style.background = `linear-gradient(to right, ${stops.join(", ")})`;
    span.dataset.strip = letters;
    span.title = `oldest left, one stretch of ${WS.describeWindow()} per mark: ` +
      [...letters].map((l) => STRIP_STATES[l] || "-").join(" ");
    return span;
  }

  /** Groups of processes: each row sums its members (`processes` of them). */
  function drawGroups(q, sort) {
    const shown = rows.filter((g) => !q || g.group.toLowerCase().includes(q));
    const table = document.getElementById("processes-table");
    const cols = figureColumns(sort);
    table.replaceChildren(headRow([[GROUPS[groupSel.value], ""], ["processes", "num"]], cols, sort));
    const body = el("tbody");
    for (const g of shown.slice(0, MAX_ROWS)) {
      const dom = WS.dominant(g.time);
      body.append(el("tr", { "data-group": g.group, "data-processes": g.processes, "data-dominant": dom },
        el("td", { textContent: g.group }), el("td", { className: "num", textContent: g.processes }),
        ...cols.map((c) => el("td", { className: "num", textContent: WS.ms(c.get(g)) })),
        el("td", {}, strip(g.strip)), el("td", {}, WS.stateBar(g.time)), el("td", { textContent: dom })));
    }
    table.append(body);
    status(`${shown.length} of ${rows.length} groups by ${GROUPS[groupSel.value]}`);
  }

  /** The status line: what is shown, the window and when it was drawn. */
  function status(what) {
    document.getElementById("processes-status").textContent =
      `${what}, ${WS.describeWindow()}, by ${sortSel.selectedOptions[0].text} · as of ${new Date().toLocaleTimeString()}`;
  }

  /** The kernel threads of `list` summed into one row, sorted like any other. */
  function kernelRow(list) {
    const time = {};
    for (const p of list) for (const [k, v] of Object.entries(p.time)) time[k] = (time[k] || 0) + v;
    return { pid: "", comm: KERNEL_ROW, folded: list, cpu_us: list.reduce((a, p) => a + p.cpu_us, 0), time };
  }

  /** The API's order, with held-up processes pinned first and kernel threads folded. */
  function arrange(list, sort) {
    const key = (p) => (sort === "active" ? [p.time.active_us, p.time.futex_us] : [figure(p, sort), 0]);
    const before = (a, b) => { const x = key(a), y = key(b); return y[0] - x[0] || y[1] - x[1]; };
    let out = list;
    if (!kernelBox.checked) {
      const kernel = list.filter((p) => p.kernel);
      out = list.filter((p) => !p.kernel);
      if (kernel.length) out = [...out, kernelRow(kernel)].sort(before);
    }
    const pinned = out.filter((p) => stuck.has(p.pid));
    return [...pinned, ...out.filter((p) => !stuck.has(p.pid))];
  }

  function processRow(p, cols, extra = {}) {
    const folded = p.folded !== undefined;
    // Pid 0: the count of other users' processes a user other than root reads.
    const name = folded
      ? el("button", { className: "fold", textContent: `${kernelOpen ? "▾" : "▸"} ${KERNEL_ROW} ×${p.folded.length}` })
      : p.pid === 0 ? el("span", { textContent: p.comm })
      : el("a", { href: `/process/${p.pid}?${WS.query({ ...WS.windowQuery() })}`, textContent: p.comm || "?" });
    if (folded) name.addEventListener("click", () => { kernelOpen = !kernelOpen; draw(); });
    const held = stuck.get(p.pid);
    const badge = held ? el("span", {
      className: "badge", textContent: `${held.threads} held up ${held.longest_s} s`,
      title: `threads blocked for ${held.longest_s} s at most in I/O, a lock or a join: see "blocked now"`,
    }) : null;
    const dom = WS.dominant(p.time);
    return el("tr", { "data-pid": p.pid, "data-dominant": dom, "data-kernel": p.kernel ? "1" : "", ...extra },
      el("td", { className: "num", textContent: p.pid }), el("td", {}, name, badge ? " " : null, badge),
      el("td", { textContent: containerText(p.container) }),
      ...cols.map((c) => el("td", { className: "num", textContent: WS.ms(c.get(p)) })),
      el("td", {}, strip(p.strip)), el("td", {}, WS.stateBar(p.time)), el("td", { textContent: dom }));
  }

  function draw() {
    const q = search.value.trim().toLowerCase();
    if (groupSel.value) {
      drawGroups(q, sortSel.value);
      return;
    }
    const sort = sortSel.value;
    const shown = arrange(rows.filter((p) => !q || String(p.pid) === q || p.comm.toLowerCase().includes(q)
      || JSON.stringify(p.container || {}).toLowerCase().includes(q)), sort);
    const table = document.getElementById("processes-table");
    const cols = figureColumns(sort);
    table.replaceChildren(headRow([["pid", "num"], ["process", ""], ["container", ""]], cols, sort));
    const body = el("tbody");
    for (const p of shown.slice(0, MAX_ROWS)) {
      if (p.folded === undefined) {
        body.append(processRow(p, cols));
        continue;
      }
      body.append(processRow(p, cols, { "data-folded": p.folded.length }));
      if (kernelOpen) for (const k of p.folded) body.append(processRow(k, cols, { className: "folded-member" }));
    }
    table.append(body);
    const more = shown.length > MAX_ROWS ? ` (first ${MAX_ROWS} shown; filter to find the rest)` : "";
    status(`${shown.length} of ${rows.length} rows${more}`);
  }

  const pctOf = (x) => `${Math.round(100 * x)}%`;
  const span = (s) => (s < 120 ? `${s} s` : `${Math.round(s / 60)} min`);
  const sec = (us) => (us >= 1e6 ? `${(us / 1e6).toFixed(1)} s` : `${WS.ms(us)} ms`);

  /** The summary's count of threads held up now, linked to the blocked view. */
  function heldUp(s) {
    const n = s.threads;
    return el("a", {
      id: "held-up", href: `/blocked?min_seconds=${s.min_s}&format=text`,
      textContent: `${n} thread${n === 1 ? "" : "s"} blocked > ${s.min_s} s now`,
      className: n ? "alert" : "",
      title: "threads off-CPU that long in I/O or on a lock or a join at the last drain; " +
        "kernel threads and threads waiting for work, a poll or a timer are not counted",
    });
  }

  /** The summary line and the processes that waited most for a CPU, with who kept it. */
  function drawHost(h) {
    const line = document.getElementById("host-summary");
    line.dataset.cpus = h.cpus;
    line.dataset.utilization = h.utilization;
    line.dataset.stuck = h.stuck.threads;
    stuck = new Map(h.stuck.processes.map((p) => [p.pid, p]));
    line.replaceChildren(
      el("strong", { textContent: `${h.cpus} CPUs` }), ` · ${pctOf(h.utilization)} busy`,
      ` · runqueue p99 ${WS.ms(h.runqueue_p99_us)} ms (${h.runqueue_waits} waits)`,
      " · ", el("a", { href: "/runqueue?cgroup=all&format=text", textContent: `${h.throttled_cgroups} cgroups throttled` }),
      " · ", heldUp(h.stuck),
      ` · history ${span(h.history_s)} of ${span(h.retention_s)}`,
      el("span", { className: "muted", textContent: ` · ${h.window}, as of ${new Date().toLocaleTimeString()}` }));
    const box = document.getElementById("starved");
    box.replaceChildren();
    if (!h.starved.length) return;
    const table = el("table", { id: "starved-table" });
    table.append(el("thead", {}, el("tr", {},
      el("th", { textContent: "waited most for a CPU" }), el("th", { className: "num", textContent: "runqueue ms" }),
      el("th", { className: "num", textContent: "CPU ms" }), el("th", { textContent: "kept off the CPU by" }))));
    const body = el("tbody");
    for (const s of h.starved) {
      const culprits = s.kept_off_cpu_by.map((c) => {
        const n = c.processes > 1 ? ` ×${c.processes}` : "";
        const where = c.cgroup && c.cgroup !== "/" ? ` (${c.cgroup})` : "";
        return `${c.name}${n}${where} ${pctOf(c.share)}`;
      }).join(", ");
      body.append(el("tr", { "data-pid": s.pid, "data-culprits": JSON.stringify(s.kept_off_cpu_by.map((c) => c.name)) },
        el("td", {}, el("a", { href: `/process/${s.pid}?${WS.query(WS.windowQuery())}`, textContent: `${s.comm} (${s.pid})` })),
        el("td", { className: "num", textContent: WS.ms(s.runqueue_us) }),
        el("td", { className: "num", textContent: WS.ms(s.cpu_us) }),
        el("td", { textContent: culprits, title: `who ran on the CPU while it waited: ${sec(s.runqueue_us)} in all` })));
    }
    table.append(body);
    box.append(table);
  }

  async function load() {
    await WS.panel("host", async () => drawHost(await WS.getJSON(`/host?${WS.query(WS.windowQuery())}`)));
    await WS.panel("processes", async () => {
      const w = WS.windowQuery();
      document.getElementById("host-graph").href = `/flamegraph?${WS.query(w)}`;
      const group = groupSel.value ? { group: groupSel.value } : {};
      const strips = groupSel.value ? {} : { strip: "1" };
      rows = await WS.getJSON(`/processes?${WS.query({ ...w, ...group, ...strips, sort: sortSel.value })}`);
      draw();
    });
    // For tests and the benchmark: how long after navigation it was drawn.
    document.body.dataset.loadedMs = String(Math.round(performance.now()));
    document.body.dataset.loaded = String(Date.now());
  }

  sortSel.addEventListener("change", () => { WS.setView({ sort: sortSel.value }); load(); });
  groupSel.addEventListener("change", () => { WS.setView({ group: groupSel.value }); load(); });
  search.addEventListener("input", () => { WS.setView({ q: search.value }); draw(); });
  kernelBox.addEventListener("change", () => { WS.setView({ kthreads: kernelBox.checked ? "1" : null }); draw(); });
  document.getElementById("controls").append(
    WS.windowPicker(load), el("label", {}, "Sort by: ", sortSel), el("label", {}, "Group by: ", groupSel),
    el("label", { title: `unticked, kernel threads are one ${KERNEL_ROW} row` }, kernelBox, " kernel threads"),
    search, WS.autoRefresh(load));
  document.getElementById("processes-legend").append(WS.legend());
  load();
});
