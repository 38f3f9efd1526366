// The thread-state timeline: one row per thread (or pool), one cell per
// stored slice, coloured by the state that filled most of it and shaded by
// how much of the cell the thread lived. Dragging across selects a range.
"use strict";

const Timeline = (() => {
  const ROW = 14;
  const COLOURS = {
    cpu: "#e8704a", runqueue: "#d9b526", throttled: "#a05cc8", futex: "#4a7fe8", io: "#3aa57a", sleep: "#b9bec7",
  };

  /** Index (into data.states) of the largest figure of `cell`, or -1. */
  function dominantIndex(cell) {
    let best = -1, v = 0;
    cell.forEach((ms, i) => { if (ms > v) { v = ms; best = i; } });
    return best;
  }

  /** The state that filled most of the row over the window. */
  function rowDominant(data, row) {
    const sums = data.states.map((_, i) => row.cells.reduce((a, c) => a + c[i], 0));
    const i = dominantIndex(sums);
    return i < 0 ? "none" : data.states[i];
  }

  /**
   * Draws `data` (a `/timeline` answer). `opts`: tooltip (element),
   * onRange(fromSeconds, untilSeconds) after a drag, highlight ({tids:
   * Set, from_ms, until_ms}: a span's threads and time, outlined).
   */
  function draw(canvas, labels, data, opts = {}) {
    labels.replaceChildren();
    for (const r of data.rows) {
      const div = document.createElement("div");
      div.textContent = r.tid !== undefined ? `${r.name} (${r.tid})` : `${r.name} ×${r.threads}`;
      div.title = div.textContent;
      div.className = "timeline-row";
      if (r.tid !== undefined) div.dataset.tid = r.tid;
      div.dataset.dominant = rowDominant(data, r);
      if (opts.highlight && opts.highlight.tids.has(r.tid)) div.classList.add("highlight");
      labels.append(div);
    }
    const cols = data.columns.length;
    const width = Math.max(200, canvas.parentElement.clientWidth - 4);
    const height = Math.max(ROW, data.rows.length * ROW);
    const g = WS.sizeCanvas(canvas, width, height);
    const cw = cols ? width / cols : width;
    data.rows.forEach((r, y) => {
      r.cells.forEach((cell, x) => {
        const i = dominantIndex(cell);
        if (i < 0) return;
        const col = data.columns[x];
        const span = Math.max(1, col.end_ms - col.start_ms);
        const filled = cell.reduce((a, b) => a + b, 0);
        g.globalAlpha = Math.min(1, 0.25 + (0.75 * filled) / span);
        g.fillStyle = COLOURS[data.states[i]] || "#888";
        g.fillRect(x * cw, y * ROW, Math.max(1, cw - 0.5), ROW - 1);
      });
    });
    g.globalAlpha = 1;
    if (opts.highlight) outline(g, data, opts.highlight, cw);

    const cellAt = (ev) => {
      const b = canvas.getBoundingClientRect();
      const x = Math.floor((ev.clientX - b.left) / cw), y = Math.floor((ev.clientY - b.top) / ROW);
      return x >= 0 && x < cols && y >= 0 && y < data.rows.length ? [x, y] : null;
    };
    let dragFrom = null;
    canvas.onmousedown = (ev) => { const c = cellAt(ev); dragFrom = c ? c[0] : null; };
    canvas.onmouseup = (ev) => {
      const c = cellAt(ev);
      if (dragFrom === null || !c || !opts.onRange) return;
      const a = Math.min(dragFrom, c[0]), b = Math.max(dragFrom, c[0]);
      dragFrom = null;
      // The columns' own bounds (ms, rounded up by the API): the range
      // holds exactly the chosen columns' slices, not the one before.
      opts.onRange(data.columns[a].start_ms / 1000, data.columns[b].end_ms / 1000);
    };
    canvas.onmousemove = (ev) => {
      const tip = opts.tooltip;
      const c = tip && cellAt(ev);
      if (!c) { if (tip) tip.style.display = "none"; return; }
      const [x, y] = c;
      const row = data.rows[y], col = data.columns[x];
      const parts = data.states.map((s, i) => [s, row.cells[x][i]]).filter(([, v]) => v > 0)
        .map(([s, v]) => `${s} ${v} ms`);
      tip.textContent = `${row.name}${row.tid !== undefined ? ` (${row.tid})` : ""}\n`
        + `${new Date(col.start_ms).toLocaleTimeString()} – ${new Date(col.end_ms).toLocaleTimeString()}\n`
        + (parts.join(", ") || "nothing recorded");
      tip.style.left = `${ev.clientX + 12}px`;
      tip.style.top = `${ev.clientY + 12}px`;
      tip.style.display = "block";
    };
    canvas.onmouseleave = () => { if (opts.tooltip) opts.tooltip.style.display = "none"; };
  }

  /** Outlines the cells of the highlighted threads its time range overlaps. */
  function outline(g, data, h, cw) {
    g.strokeStyle = "#111";
    g.lineWidth = 2;
    data.rows.forEach((r, y) => {
      if (!h.tids.has(r.tid)) return;
      data.columns.forEach((col, x) => {
        if (col.end_ms < h.from_ms || col.start_ms > h.until_ms) return;
        g.strokeRect(x * cw + 1, y * ROW + 1, Math.max(1, cw - 2), ROW - 3);
      });
    });
  }

  return { draw, rowDominant };
})();
