// The host page: every process with its wall time split by state.
"use strict";

WS.ready.then(() => {
  const { el } = WS;
  /** Labels of the sort orders whose name is not the word shown. */
  const SORT_LABELS = { cpu: "CPU", io: "I/O" };
  /** The orders the API takes, the default ("wall") first. */
  const sorts = [...WS.SORTS].sort((a, b) => (b === "wall") - (a === "wall"));
  /** Most rows drawn; the filter reaches the rest. */
  const MAX_ROWS = 500;
  let rows = [];

  const sortSel = el("select", { id: "sort" });
  for (const v of sorts) sortSel.append(el("option", { value: v, textContent: SORT_LABELS[v] || v }));
  sortSel.value = WS.view().get("sort") || "wall";
  /** `/processes?group=` choices; "" lists processes one by one. */
  const GROUPS = { "": "nothing", comm: "name", parent: "parent", cgroup: "cgroup", container: "container" };
  const groupSel = el("select", { id: "group" });
  for (const [v, label] of Object.entries(GROUPS)) groupSel.append(el("option", { value: v, textContent: label }));
  groupSel.value = WS.view().get("group") || "";
  const search = el("input", {
    type: "search", id: "search", placeholder: "name, pid or container", value: WS.view().get("q") || "",
  });

  const containerText = (c) => (c ? [c.namespace, c.pod, c.container, c.id && c.id.slice(0, 12)].filter(Boolean).join("/") : "");
  const figure = (p, sort) => (sort === "cpu" ? p.time.cpu_us : p.time[`${sort}_us`]) || 0;

  /** Groups of processes: each row sums its members (`processes` of them). */
  function drawGroups(q, sort) {
    const shown = rows.filter((g) => !q || g.group.toLowerCase().includes(q));
    const table = document.getElementById("processes-table");
    table.replaceChildren();
    const head = el("tr", {},
      el("th", { textContent: GROUPS[groupSel.value] }), el("th", { className: "num", textContent: "processes" }),
      el("th", { className: "num", textContent: `${sortSel.selectedOptions[0].text} ms` }),
      el("th", { className: "num", textContent: "wall ms" }), el("th", { className: "num", textContent: "CPU ms" }),
      el("th", { textContent: "time by state" }), el("th", { textContent: "mostly" }));
    table.append(el("thead", {}, head));
    const body = el("tbody");
    for (const g of shown.slice(0, MAX_ROWS)) {
      const dom = WS.dominant(g.time);
      body.append(el("tr", { "data-group": g.group, "data-processes": g.processes, "data-dominant": dom },
        el("td", { textContent: g.group }), el("td", { className: "num", textContent: g.processes }),
        el("td", { className: "num", textContent: WS.ms(figure(g, sort)) }),
        el("td", { className: "num", textContent: WS.ms(g.time.wall_us) }),
        el("td", { className: "num", textContent: WS.ms(g.time.cpu_us) }),
        el("td", {}, WS.stateBar(g.time)), el("td", { textContent: dom })));
    }
    table.append(body);
    document.getElementById("processes-status").textContent =
      `${shown.length} of ${rows.length} groups by ${GROUPS[groupSel.value]}, ${WS.describeWindow()}, by ${sortSel.selectedOptions[0].text} · ${new Date().toLocaleTimeString()}`;
  }

  function draw() {
    const q = search.value.trim().toLowerCase();
    if (groupSel.value) {
      drawGroups(q, sortSel.value);
      return;
    }
    const sort = sortSel.value;
    const shown = rows.filter((p) => !q || String(p.pid) === q || p.comm.toLowerCase().includes(q)
      || JSON.stringify(p.container || {}).toLowerCase().includes(q));
    const table = document.getElementById("processes-table");
    table.replaceChildren();
    const head = el("tr", {},
      el("th", { className: "num", textContent: "pid" }), el("th", { textContent: "process" }),
      el("th", { textContent: "container" }), el("th", { className: "num", textContent: `${sortSel.selectedOptions[0].text} ms` }),
      el("th", { className: "num", textContent: "wall ms" }), el("th", { className: "num", textContent: "CPU ms" }),
      el("th", { textContent: "time by state" }), el("th", { textContent: "mostly" }));
    table.append(el("thead", {}, head));
    const body = el("tbody");
    for (const p of shown.slice(0, MAX_ROWS)) {
      const link = el("a", { href: `/process/${p.pid}?${WS.query({ ...WS.windowQuery() })}`, textContent: p.comm || "?" });
      const dom = WS.dominant(p.time);
      body.append(el("tr", { "data-pid": p.pid, "data-dominant": dom },
        el("td", { className: "num", textContent: p.pid }), el("td", {}, link),
        el("td", { textContent: containerText(p.container) }),
        el("td", { className: "num", textContent: WS.ms(figure(p, sort)) }),
        el("td", { className: "num", textContent: WS.ms(p.time.wall_us) }),
        el("td", { className: "num", textContent: WS.ms(p.time.cpu_us) }),
        el("td", {}, WS.stateBar(p.time)), el("td", { textContent: dom })));
    }
    table.append(body);
    const more = shown.length > MAX_ROWS ? ` (first ${MAX_ROWS} shown; filter to find the rest)` : "";
    document.getElementById("processes-status").textContent =
      `${shown.length} of ${rows.length} processes, ${WS.describeWindow()}, by ${sortSel.selectedOptions[0].text}${more} · ${new Date().toLocaleTimeString()}`;
  }

  const pctOf = (x) => `${Math.round(100 * x)}%`;
  const span = (s) => (s < 120 ? `${s} s` : `${Math.round(s / 60)} min`);
  const sec = (us) => (us >= 1e6 ? `${(us / 1e6).toFixed(1)} s` : `${WS.ms(us)} ms`);

  /** The summary line and the processes that waited most for a CPU, with who kept it. */
  function drawHost(h) {
    const line = document.getElementById("host-summary");
    line.dataset.cpus = h.cpus;
    line.dataset.utilization = h.utilization;
    line.replaceChildren(
      el("strong", { textContent: `${h.cpus} CPUs` }), ` · ${pctOf(h.utilization)} busy`,
      ` · runqueue p99 ${WS.ms(h.runqueue_p99_us)} ms (${h.runqueue_waits} waits)`,
      " · ", el("a", { href: "/runqueue?cgroup=all&format=text", textContent: `${h.throttled_cgroups} cgroups throttled` }),
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
      rows = await WS.getJSON(`/processes?${WS.query({ ...w, ...group, sort: sortSel.value })}`);
      draw();
    });
    // For tests and the benchmark: how long after navigation it was drawn.
    document.body.dataset.loadedMs = String(Math.round(performance.now()));
    document.body.dataset.loaded = String(Date.now());
  }

  sortSel.addEventListener("change", () => { WS.setView({ sort: sortSel.value }); load(); });
  groupSel.addEventListener("change", () => { WS.setView({ group: groupSel.value }); load(); });
  search.addEventListener("input", () => { WS.setView({ q: search.value }); draw(); });
  document.getElementById("controls").append(
    WS.windowPicker(load), el("label", {}, "Sort by: ", sortSel), el("label", {}, "Group by: ", groupSel),
    search, WS.autoRefresh(load));
  document.getElementById("processes-legend").append(WS.legend());
  load();
});
