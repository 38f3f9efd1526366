// Flame graphs drawn from folded stacks (`/folded`) on a canvas: search,
// zoom by click, a before/after diff, and functions by self and total time.
// Written here rather than taken from a library: the daemon serves its UI
// with nothing fetched from elsewhere, and this is a few hundred lines.
"use strict";

const Flame = (() => {
  const ROW = 16;

  /** Parses folded text ("a;b;c 123" lines) into stacks. */
  function parse(text) {
    const stacks = [];
    for (const line of text.split("\n")) {
      const at = line.lastIndexOf(" ");
      if (at <= 0) continue;
      const value = Number(line.slice(at + 1));
      if (!Number.isFinite(value) || value <= 0) continue;
      stacks.push({ frames: line.slice(0, at).split(";"), value });
    }
    return stacks;
  }

  function node(name, parent) {
    return { name, value: 0, self: 0, children: new Map(), parent, x: 0, depth: parent ? parent.depth + 1 : 0 };
  }

  /** The call tree of `stacks`, root named "all". */
  function tree(stacks) {
    const root = node("all", null);
    for (const s of stacks) {
      root.value += s.value;
      let at = root;
      for (const f of s.frames) {
        let child = at.children.get(f);
        if (!child) {
          child = node(f, at);
          at.children.set(f, child);
        }
        child.value += s.value;
        at = child;
      }
      at.self += s.value;
    }
    layout(root, 0);
    return root;
  }

  function layout(n, x) {
    n.x = x;
    let cx = x;
    const kids = [...n.children.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    for (const c of kids) {
      layout(c, cx);
      cx += c.value;
    }
    n.sorted = kids;
  }

  function depthOf(n) {
    let d = n.depth;
    for (const c of n.children.values()) d = Math.max(d, depthOf(c));
    return d;
  }

  /** The value of the same path in `other` (a tree of another window). */
  function pathValue(n, other) {
    const path = [];
    for (let at = n; at.parent; at = at.parent) path.push(at.name);
    let at = other;
    for (let i = path.length - 1; i >= 0 && at; i--) at = at.children.get(path[i]);
    return at ? at.value : 0;
  }

  function hash(name) {
    let h = 0;
    for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) | 0;
    return Math.abs(h);
  }

  function colour(n, matches, before, root) {
    if (matches && matches(n.name)) return "#d63bd6";
    if (before) {
      const now = n.value / root.value;
      const then = before.value ? pathValue(n, before) / before.value : 0;
      const d = Math.max(-1, Math.min(1, (now - then) / Math.max(now, then, 1e-9)));
      if (d > 0.05) return `rgb(${230},${Math.round(200 - 150 * d)},${Math.round(200 - 150 * d)})`;
      if (d < -0.05) return `rgb(${Math.round(200 + 150 * d)},${Math.round(200 + 150 * d)},${230})`;
      return "rgb(215,215,215)";
    }
    if (n.name.endsWith("_[k]")) return `hsl(${20 + (hash(n.name) % 20)},70%,72%)`;
    if (/_\[[j0-9i]\]$/.test(n.name)) return `hsl(${95 + (hash(n.name) % 30)},55%,62%)`;
    return `hsl(${hash(n.name) % 50},80%,${58 + (hash(n.name) % 12)}%)`;
  }

  /**
   * A flame graph on `canvas`. `opts`: search (substring, case-insensitive),
   * before (folded text of an earlier window, for a diff), tooltip (an
   * element), onZoom. Returns {total, frames, matched}.
   */
  function draw(canvas, text, opts = {}) {
    const root = tree(parse(text));
    const before = opts.before ? tree(parse(opts.before)) : null;
    const needle = (opts.search || "").toLowerCase();
    const matches = needle ? (name) => name.toLowerCase().includes(needle) : null;
    let zoom = root;
    let rects = [];
    const frames = countNodes(root) - 1;

    function render() {
      const width = Math.max(300, canvas.parentElement.clientWidth - 2);
      const height = (depthOf(root) + 1) * ROW;
      const g = WS.sizeCanvas(canvas, width, height);
      g.font = "11px system-ui, sans-serif";
      g.textBaseline = "middle";
      rects = [];
      const scale = root.value ? width / zoom.value : 0;
      const visit = (n) => {
        const inZoom = n.x + n.value > zoom.x && n.x < zoom.x + zoom.value;
        if (!inZoom) return;
        const onPath = n.depth < zoom.depth;
        const x = onPath ? 0 : (n.x - zoom.x) * scale;
        const w = onPath ? width : n.value * scale;
        if (w < 0.4) return;
        const y = n.depth * ROW;
        g.fillStyle = colour(n, matches, before, root);
        g.fillRect(x, y, Math.max(w - 0.5, 0.4), ROW - 1);
        if (w > 30) {
          g.fillStyle = "#111";
          const label = fit(g, n.name, w - 6);
          if (label) g.fillText(label, x + 3, y + ROW / 2);
        }
        rects.push([x, y, w, n]);
        for (const c of n.sorted) visit(c);
      };
      if (root.value) visit(root);
    }

    function at(ev) {
      const b = canvas.getBoundingClientRect();
      const x = ev.clientX - b.left, y = ev.clientY - b.top;
      for (const r of rects) if (x >= r[0] && x < r[0] + r[2] && y >= r[1] && y < r[1] + ROW) return r[3];
      return null;
    }

    canvas.onclick = (ev) => {
      const n = at(ev);
      zoom = n && n !== zoom ? n : root;
      render();
      if (opts.onZoom) opts.onZoom(zoom === root ? null : zoom.name);
    };
    canvas.onmousemove = (ev) => {
      const tip = opts.tooltip;
      if (!tip) return;
      const n = at(ev);
      if (!n) { tip.style.display = "none"; return; }
      let extra = "";
      if (before) {
        const then = pathValue(n, before);
        extra = `\nbefore: ${WS.pct(then, before.value)}% · after: ${WS.pct(n.value, root.value)}%`;
      }
      tip.textContent = `${n.name}\n${WS.ms(n.value)} ms, ${WS.pct(n.value, root.value)}% of all (self ${WS.ms(n.self)} ms)${extra}`;
      tip.style.left = `${ev.clientX + 12}px`;
      tip.style.top = `${ev.clientY + 12}px`;
      tip.style.display = "block";
    };
    canvas.onmouseleave = () => { if (opts.tooltip) opts.tooltip.style.display = "none"; };
    render();
    return { total: root.value, frames, matched: matches ? matchedValue(root, matches) : 0, rerender: render };
  }

  function countNodes(n) {
    let c = 1;
    for (const k of n.children.values()) c += countNodes(k);
    return c;
  }

  /** Time under frames that match, each counted once (not under a match). */
  function matchedValue(n, matches) {
    if (n.parent && matches(n.name)) return n.value;
    let v = 0;
    for (const c of n.children.values()) v += matchedValue(c, matches);
    return v;
  }

  function fit(g, text, width) {
    if (g.measureText(text).width <= width) return text;
    let lo = 0, hi = text.length;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (g.measureText(`${text.slice(0, mid)}…`).width <= width) lo = mid; else hi = mid - 1;
    }
    return lo > 2 ? `${text.slice(0, lo)}…` : "";
  }

  /** Functions by self and total time (a function counted once a stack). */
  function functions(text) {
    const by = new Map();
    let all = 0;
    for (const s of parse(text)) {
      all += s.value;
      const seen = new Set();
      s.frames.forEach((f, i) => {
        let e = by.get(f);
        if (!e) by.set(f, (e = { name: f, self: 0, total: 0 }));
        if (!seen.has(f)) { e.total += s.value; seen.add(f); }
        if (i === s.frames.length - 1) e.self += s.value;
      });
    }
    return { all, rows: [...by.values()] };
  }

  return { parse, tree, draw, functions };
})();
